/**
 * Holds a chosen statement of the service in the middle of its execution, in
 * the database, for as long as a test needs: test-only triggers (installed in
 * the test's own database, never in the schema) wait on an advisory lock the
 * test holds. While the test holds it, every such statement waits, visible in
 * pg_stat_activity as `wait_event = 'advisory'` with its query text; the test
 * then faults exactly those backends (pg_terminate_backend, or an RST of their
 * connection found by client_port) and lets go.
 *
 * - `claim`: the claim's INSERT into idempotency_keys (BEFORE INSERT).
 * - `payment-insert`: the completion's INSERT into payments (BEFORE INSERT).
 * - `commit`: the completion's COMMIT, after its fence ran: a DEFERRABLE
 *   INITIALLY DEFERRED constraint trigger on payments fires inside COMMIT.
 * - `release`: the UPDATE that releases a key (processing -> released).
 *
 * Without the lock held, each trigger takes and drops a shared advisory lock:
 * a few microseconds. Advisory locks are per database, so other test files'
 * databases on the same server are untouched. The trigger function sets
 * lock_timeout = 0 for itself: the service's own 1 s lock_timeout would end
 * the wait before the test acts; its 5 s statement_timeout still bounds it.
 */
import type postgres from 'postgres'

export const HOLDS = {
  // pg_stat_activity shows the claim's first kilobyte: its leading comment (core/claim-sql.ts).
  'claim': { lock: 1_606_001, query: /insert into idempotency_keys|idempotent-post: claim/i },
  // The payment INSERT: its own statement in the transactional form, a part of
  // the one completing statement in the declarative form (core/complete-rows.ts),
  // or of a statement that carries claims and completions together (core/lane.ts),
  // whose first kilobyte ends before the completion's part: its leading comment
  // names it (seen on a busy machine, where completions queue behind claims).
  'payment-insert': { lock: 1_606_002, query: /insert into payments|done as \(\s*update idempotency_keys|idempotent-post: claim and complete/i },
  // COMMIT: the statement of the transactional form, or the end of the completing statement (its implicit commit).
  'commit': { lock: 1_606_003, query: /^\s*commit\s*$|done as \(\s*update idempotency_keys|idempotent-post: claim and complete/i },
  'release': { lock: 1_606_004, query: /set status = 'released'/i },
} as const
export type HoldName = keyof typeof HOLDS

export async function installHolds(sql: postgres.Sql): Promise<void> {
  await sql.unsafe(`
    create or replace function test_edges_hold() returns trigger language plpgsql set lock_timeout = 0 as $$
    begin
      perform pg_advisory_lock_shared(tg_argv[0]::bigint);
      perform pg_advisory_unlock_shared(tg_argv[0]::bigint);
      return new;
    end $$;
    drop trigger if exists test_edges_claim on idempotency_keys;
    create trigger test_edges_claim before insert on idempotency_keys
      for each row execute function test_edges_hold('${HOLDS.claim.lock}');
    drop trigger if exists test_edges_payment_insert on payments;
    create trigger test_edges_payment_insert before insert on payments
      for each row execute function test_edges_hold('${HOLDS['payment-insert'].lock}');
    drop trigger if exists test_edges_commit on payments;
    create constraint trigger test_edges_commit after insert on payments deferrable initially deferred
      for each row execute function test_edges_hold('${HOLDS.commit.lock}');
    drop trigger if exists test_edges_release on idempotency_keys;
    create trigger test_edges_release before update on idempotency_keys
      for each row when ((old.status = 'processing' or (old.status is null and old.digest is not null)) and new.status = 'released')
      execute function test_edges_hold('${HOLDS.release.lock}');`)
}

/** A service backend, as pg_stat_activity shows it. */
export interface Backend {
  readonly pid: number
  readonly application_name: string
  /** The proxy's port towards the server, when the service connects through one (ProxyConnection.serverSidePort). */
  readonly client_port: number
  readonly state: string
  readonly query: string
  readonly wait_event: string | null
}

export interface Hold {
  /** Service backends (application_name idempotent-post:<pid>:..., of the service process `pid` when given) waiting on this hold right now, with their statement. */
  waiting(pid?: number): Promise<Backend[]>
  /** Lets every held statement go on, and gives the connection back. */
  release(): Promise<void>
}

/** Takes the hold's lock on a connection of its own: from now on, the hold's statements wait. */
export async function hold(sql: postgres.Sql, name: HoldName): Promise<Hold> {
  const { lock } = HOLDS[name]
  const holder = await sql.reserve()
  await holder`select pg_advisory_lock(${lock})`
  let released = false
  return {
    waiting: (pid) => sql<Backend[]>`
      select a.pid, a.application_name, a.client_port, a.state, a.query, a.wait_event
        from pg_stat_activity a
        join pg_locks l on l.pid = a.pid and l.locktype = 'advisory' and not l.granted
                       and l.database = (select oid from pg_database where datname = current_database())
                       and l.classid = 0 and l.objid = ${lock} and l.objsubid = 1
       where a.datname = current_database() and a.application_name like ${applicationNames(pid)}`,
    async release() {
      if (released) return
      released = true
      try {
        await holder`select pg_advisory_unlock(${lock})`
      } finally {
        holder.release()
      }
    },
  }
}

/** A LIKE pattern for the application_name of the service's connections: idempotent-post:<pid>:<pool>. */
const applicationNames = (pid?: number) => `idempotent-post:${pid ?? '%'}:%`

/** The service's backends in this database (of the process `pid` when given), in `state` when given. */
export function serviceBackends(sql: postgres.Sql, options: { state?: string; pid?: number } = {}): Promise<Backend[]> {
  return sql<Backend[]>`
    select pid, application_name, client_port, state, query, wait_event from pg_stat_activity
     where datname = current_database() and application_name like ${applicationNames(options.pid)}
       and (${options.state ?? null}::text is null or state = ${options.state ?? null})`
}

/** pg_terminate_backend of each, from the test's connection; returns the pids it signalled. */
export async function terminate(sql: postgres.Sql, backends: readonly Backend[]): Promise<number[]> {
  if (backends.length === 0) return []
  const rows = await sql<{ pid: number; ok: boolean }[]>`
    select pid, pg_terminate_backend(pid) as ok from unnest(${sql.array(backends.map((b) => b.pid))}::int[]) as pid`
  return rows.filter((row) => row.ok).map((row) => row.pid)
}
