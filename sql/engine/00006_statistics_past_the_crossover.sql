-- @online
-- Statistics that never describe the key tables as tiny.
--
-- The engine's statements are prepared, and PostgreSQL keeps a generic plan
-- until the table's statistics change. Every statement on the request path
-- reaches idempotency_keys and idempotency_processing by per-key probes
-- (src/core/claim-sql.ts, batch-input.ts), which the planner prefers to a
-- sequential scan from a few pages up: measured, from 13 pages of keys and
-- 4 of the processing list (test/store/request-path-plans.test.ts). Below
-- that a sequential scan is cheaper, and right, but a plan made then is kept
-- while the table grows until the next autovacuum: with the defaults that is
-- the first minute after a deployment's first 50 requests (a smoke test),
-- when a first benchmark or a burst then reads the whole table per key.
--
-- So autovacuum first looks at these tables after 1,000 changes (some 500
-- keys, over 80 pages; for the processing list, 1,000 rows come and gone,
-- its vacuum threshold already), and a vacuum never gives the empty pages at
-- the end back (vacuum_truncate): a list that is nearly always empty keeps
-- the size it had under load, and a purge does not shrink the keys'
-- statistics below the crossover either. The list's rows are small (1,000
-- of them fill 8 pages, where a single-key delete still prefers a scan):
-- filled to a tenth, they take about 80, a few hundred kB that every reader
-- of the list then reaches by its primary key. Both only set storage
-- parameters: SHARE UPDATE EXCLUSIVE, which no read or write waits on, so
-- this runs while the previous release serves.
alter table idempotency_keys set (
  autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_threshold = 1000,
  autovacuum_analyze_threshold = 1000,
  vacuum_truncate = false
);
alter table idempotency_processing set (
  fillfactor = 10,
  autovacuum_analyze_scale_factor = 0,
  autovacuum_analyze_threshold = 1000,
  vacuum_truncate = false
);
