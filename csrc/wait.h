/* The phase counters: a phase is "store my EPOCH counter (release), wake peers whose
 * SLEEPING flag is set; wait until every peer's counter is as high". Waits go pause-spin
 * -> sched_yield -> futex on the low 32 bits of the peer's counter, and give up at the
 * caller's budget (ST_PENDING) so that Python can poll deadline, peers and notices. */
#ifndef PYC_WAIT_H
#define PYC_WAIT_H

#include "native.h"

/* Enter the next phase: bump this rank's counter, wake sleepers; returns the new value. */
int64_t pyc_bump(ArenaObject *a);

/* Wait until every peer's counter reaches c->target; ST_PENDING if `end` comes first
 * (c->wpeer, c->wstarted and c->wt0 keep where it was, for the next try). */
int pyc_wait_all(ArenaObject *a, call_t *c, int64_t end);

/* Whether peer q's announcement (read under its seqlock) is consistent with the call. */
int pyc_ann_ok(ArenaObject *a, call_t *c, int q);

/* pyc_wait_all, then (once) every peer's announcement checked against the call:
 * ST_CHECK with c->check_peer set for one that differs. */
int pyc_phase_wait(ArenaObject *a, call_t *c, int64_t end);

#endif
