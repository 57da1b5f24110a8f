/* CallPath: a group's compiled per-call path of repeated calls (the handle core/group.py
 * holds as `fast`, made by runners/native.py). It reads and writes the group's and the
 * engine's state through their C-owned records (callstate.h). See callpath.c. */
#ifndef PYC_CALLPATH_H
#define PYC_CALLPATH_H

#include "native.h"

extern PyTypeObject CallPathType;

/* The flight recorder's and the lock's attribute names it uses, interned once (module.c). */
int pyc_callpath_names(void);

#endif
