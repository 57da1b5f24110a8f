/* The arena's collectives as resumable state machines (the phases, buffers and share
 * boundaries of shm/collectives.py). pyc_start_call announces a call and sets it up;
 * pyc_step runs it until it is done or needs the caller:
 *   ST_DONE     finished;
 *   ST_PENDING  a wait outlived the budget (about a millisecond): the caller checks
 *               deadline, dead peers and abort notices in Python, then steps again;
 *   ST_CHECK    after the call's first wait, peer c.check_peer's announcement differs
 *               from ours: the caller judges it (MismatchError or not), then steps again;
 *   ST_VIEWS    every rank may hold its buffer in shared memory: the caller hands over
 *               the peers' buffers (c.views, c.have_views) or none, then steps again.
 * The GIL is released while waiting and around large copies and reductions, and held
 * again when pyc_step returns. */
#ifndef PYC_ARENA_H
#define PYC_ARENA_H

#include "native.h"

/* Announce a call (a seqlock: SEQ is 0 while the words change) and set it up to run;
 * `inobj` and `outobj` (either may be NULL) are kept alive until it ends. */
void pyc_start_call(ArenaObject *a, const PlanObject *plan, char *in, char *out, int64_t n,
                    int64_t seq, const int64_t *shared, PyObject *inobj, PyObject *outobj);

/* Run the current call for at most budget_ns of waiting; returns its status (above). */
int pyc_step(ArenaObject *a, int64_t budget_ns);

#endif
