/**
 * A condition on a batch member's position `i.n` that always holds, written
 * for the planner: jsonb_to_recordset() is estimated at 100 rows whatever it
 * is given, and against 100 members a hash join over a sequential scan of
 * the key table looks cheaper than 100 index probes until the table has
 * hundreds of pages. A generic plan made while the table was small (every
 * new deployment) was then kept while it grew, and every batch read the
 * whole table (issue 25). A range of a column without statistics is
 * estimated at 0.5 % of the rows (PostgreSQL's DEFAULT_RANGE_INEQ_SEL), so
 * the members count as one, and every join on them probes the primary keys.
 * test/store/request-path-plans.test.ts checks the plans.
 */
export const FEW_MEMBERS = 'i.n between 0 and 2147483647'

/**
 * Milliseconds a statement carrying more than one member waits on a row lock
 * before it gives up (its lock_timeout, for that statement alone:
 * set_config(..., true) ends with its implicit transaction). Such a statement
 * waits for all its members at once: one member's row locked by another
 * session (an uncommitted insert of its key, an operator's SELECT ... FOR
 * UPDATE) held every member for the session's lock_timeout (1 s) and then
 * failed them all (issue 46: 17 requests of other keys, of both tenants,
 * answered 503 for one locked row). Our own statements hold a key's row for
 * a few milliseconds (tens on a busy machine); past this, the statement ends
 * having written nothing, and its members are sent again each alone
 * (batcher.ts isolate), where only the one whose row is locked waits, with
 * the session's full lock_timeout, and again while its deadline leaves time.
 */
export const SHARED_LOCK_WAIT_MS = 50

/** A condition that always holds and sets SHARED_LOCK_WAIT_MS for the statement, evaluated with its first input row, before any row is locked. */
export const SHARED_LOCK_WAIT = `set_config('lock_timeout', '${SHARED_LOCK_WAIT_MS}ms', true) is not null`

/** The input's condition: FEW_MEMBERS, and the short lock wait when the statement carries more than one member. */
export const membersCondition = (shared: boolean) => (shared ? `${FEW_MEMBERS} and ${SHARED_LOCK_WAIT}` : FEW_MEMBERS)
