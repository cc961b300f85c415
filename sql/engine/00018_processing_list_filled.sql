-- @online
-- Fewer bytes per key (issue 40): the processing list filled to 100 % (25 since
-- 00010). An entry is inserted at the claim and deleted at the completion,
-- never updated, so nothing needs the room a fillfactor keeps. Filled to a
-- quarter, the dead entries took 453-455 B per payment after 4,000 (32 at a
-- time), before the first vacuum; filled whole, 127-147 (bench/key-bytes.ts:
-- 1,688-1,692 B per completed key before, 1,364-1,397 after).
--
-- What kept the list at a quarter was the planner (00006, 00010): the request
-- path's statements reach the list by its primary key only from a few pages up
-- (the batched completions from about 8, the three single-key deletes of a
-- release, a stale take-over and idempotency_complete from about 20), and a
-- plan is kept until the list's statistics change. Those changed at its first
-- vacuum, after 50 dead entries by default: a smoke test's worth, a page or
-- four, and a statement whose generic plan was made on them read the list
-- whole until the vacuum after (true at a quarter too, for the single-key
-- deletes; at 100 %, 2,322 scans over 100,000 payments in growth-scans.test.ts
-- with the first look at 50). So the list is
-- first vacuumed and analyzed after 10,000 entries come and gone, like the
-- keys after their first 1,000 changes: at 100 % that is 76 to 80 pages (48 and
-- 4 requests at a time; 25 to 35 after 5,000), where every statement probes
-- (test/store/request-path-plans.test.ts, growth-scans.test.ts), and the list
-- never gives its pages back (vacuum_truncate, 00006), so its statistics never
-- describe it as smaller. Until then its dead entries take 640 kB at most.
--
-- Online: storage parameters only (SHARE UPDATE EXCLUSIVE, which no read or
-- write waits on), used as pages are next filled and at autovacuum's next
-- look; the release before writes and reads the list the same way.
alter table idempotency_processing set (
  fillfactor = 100,
  autovacuum_vacuum_threshold = 10000,
  autovacuum_vacuum_insert_threshold = 10000,
  autovacuum_analyze_threshold = 20000
);
