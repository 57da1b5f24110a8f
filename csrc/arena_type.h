/* The Arena type: this rank's view of a group's arena (shm/native.py NativeArena holds
 * one), the Python face of the state machines of arena.c and the waits of wait.c. */
#ifndef PYC_ARENA_TYPE_H
#define PYC_ARENA_TYPE_H

#include "native.h"

extern PyTypeObject ArenaType;

#endif
