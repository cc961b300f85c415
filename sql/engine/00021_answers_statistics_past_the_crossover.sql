-- @online
-- The answers' statistics never describe them as tiny (00006 did so for the
-- keys and the list; test/store/request-path-plans.test.ts).
--
-- A key's read (the claim, a replay, a take-over) joins its answer by the
-- answers' primary key (src/core/key-states.ts). With PostgreSQL's defaults
-- autovacuum first analyzes idempotency_answers after 50 answers, three
-- pages; a generic plan made on those statistics read the answers whole in
-- every claim, and kept doing so while the table grew until the next look.
-- So it is first analyzed after 1,000 answers (about 55 pages, where every
-- statement probes), and never gives its empty pages back (vacuum_truncate),
-- so a purge does not shrink its statistics below the crossover either. The
-- answers are only inserted and deleted: the insert threshold is its vacuum's.
--
-- Online: storage parameters only (SHARE UPDATE EXCLUSIVE, which no read or
-- write waits on); the release before reads and writes the table the same way.
alter table idempotency_answers set (
  autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_threshold = 1000,
  autovacuum_analyze_threshold = 1000,
  vacuum_truncate = false
);
