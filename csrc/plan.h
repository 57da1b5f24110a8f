/* Plan: one call signature (collective, dtype, op, root, AVG's divisor, the announcement
 * words), checked and compiled once; Arena.run and CallPath take it. */
#ifndef PYC_PLAN_H
#define PYC_PLAN_H

#include "native.h"

extern PyTypeObject PlanType;

#endif
