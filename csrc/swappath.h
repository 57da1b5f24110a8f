/* SwapPath: the compiled path of repeated small all_reduce calls between two ranks over
 * TCP (the group's `fast` over the scheduled runner, runners/swap.py). See swappath.c. */
#ifndef PYC_SWAPPATH_H
#define PYC_SWAPPATH_H

#include "native.h"

extern PyTypeObject SwapPathType;

#endif
