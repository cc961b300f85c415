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
