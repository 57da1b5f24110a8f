/* Fast: a group's compiled per-call path of repeated calls (core/group.py `fast`,
 * runners/native.py). See callpath.c. */
#ifndef PYC_CALLPATH_H
#define PYC_CALLPATH_H

#include "native.h"

extern PyTypeObject FastType;

/* The attribute names the per-call path reads, interned once (module.c calls this). */
int pyc_callpath_names(void);

#endif
