import type postgres from 'postgres'

/**
 * What the fresh payments did to the tables, read from PostgreSQL's own
 * counters (pg_stat_user_tables), so it holds whatever the engine's schema:
 * every table that was updated, its updates and how many were HOT (heap-only:
 * no new index entry, the old version pruned in place). And, per btree index
 * of those tables, how many entries it holds beyond the rows it should
 * (contrib pageinspect): dead entries that only VACUUM removes.
 */
export interface TableCounters {
  inserts: number
  updates: number
  hotUpdates: number
  deletes: number
  deadRows: number
  liveRows: number
  vacuums: number
}

export type TableSnapshot = Map<string, TableCounters>

export interface TableChange extends TableCounters {
  table: string
  /** hotUpdates / updates, in % (NaN without updates). */
  hotPercent: number
}

/** Counters of every table of the public schema. Read after the backends that did the work have ended (they flush on exit). */
export async function readTableCounters(sql: postgres.Sql): Promise<TableSnapshot> {
  const rows = await sql<({ relname: string } & Record<keyof TableCounters, string>)[]>`
    select relname, n_tup_ins as inserts, n_tup_upd as updates, n_tup_hot_upd as "hotUpdates", n_tup_del as deletes,
           n_dead_tup as "deadRows", n_live_tup as "liveRows", vacuum_count + autovacuum_count as vacuums
      from pg_stat_user_tables where schemaname = 'public'`
  return new Map(rows.map(({ relname, ...counters }) => [relname, Object.fromEntries(Object.entries(counters).map(([k, v]) => [k, Number(v)])) as unknown as TableCounters]))
}

/** after − before, for the tables that were updated in between (n_dead_tup and n_live_tup as of `after`). */
export function updatedTables(after: TableSnapshot, before: TableSnapshot): TableChange[] {
  const out: TableChange[] = []
  for (const [table, now] of after) {
    const was = before.get(table)
    const d = (field: keyof TableCounters) => now[field] - (was?.[field] ?? 0)
    const updates = d('updates')
    if (updates <= 0) continue
    out.push({
      table,
      inserts: d('inserts'),
      updates,
      hotUpdates: d('hotUpdates'),
      deletes: d('deletes'),
      deadRows: now.deadRows,
      liveRows: now.liveRows,
      vacuums: d('vacuums'),
      hotPercent: Math.round((d('hotUpdates') / updates) * 1000) / 10,
    })
  }
  return out.sort((a, b) => b.updates - a.updates)
}

/**
 * Waits until no backend other than the bench's own is connected to
 * `database`: a backend flushes its table counters when it exits, so after
 * this the counters include everything the stopped service did.
 */
export async function waitForBackendsGone(sql: postgres.Sql, database: string, benchApplication: string, timeoutMs = 15_000): Promise<void> {
  const deadline = performance.now() + timeoutMs
  for (;;) {
    const [row] = await sql<{ n: number }[]>`
      select count(*)::int as n from pg_stat_activity where datname = ${database} and application_name <> ${benchApplication} and pid <> pg_backend_pid()`
    if (row!.n === 0) return
    if (performance.now() > deadline) throw new Error(`${row!.n} backends of a stopped service still connected to ${database} after ${timeoutMs} ms`)
    await Bun.sleep(20)
  }
}

export interface IndexEntries {
  table: string
  index: string
  /** The partial index's predicate, or null. */
  predicate: string | null
  /** Heap pointers in the index's leaf pages (a posting list counts each of its TIDs). */
  entries: number
  /** Of which marked dead (LP_DEAD) by scans that found their row gone. */
  markedDead: number
  /** Rows of the table the index should point to now (live, matching the predicate). */
  liveRows: number
  /** entries − liveRows: entries for row versions that are gone or no longer match. */
  excess: number
  pages: number
}

export type IndexChurn = { ok: true; indexes: IndexEntries[] } | { ok: false; note: string }

/**
 * Dead index entries, per btree index of `tables`, counted with contrib
 * pageinspect (created in the bench's own database if it can be). The
 * entries are counted from the leaf pages (high keys excluded, posting lists
 * expanded), the rows with the index's own predicate: what is left over is
 * what the updates left behind in the index and VACUUM has not removed yet.
 * Non-btree indexes are left out.
 */
export async function indexChurn(sql: postgres.Sql, tables: readonly string[]): Promise<IndexChurn> {
  if (tables.length === 0) return { ok: true, indexes: [] }
  try {
    await sql`create extension if not exists pageinspect`
  } catch (error) {
    return { ok: false, note: `pageinspect is not available (${error instanceof Error ? error.message : String(error)}): dead index entries not measured` }
  }
  const indexes = await sql<{ table: string; index: string; predicate: string | null; pages: number }[]>`
    select c.relname as table, ic.relname as index, pg_get_expr(i.indpred, i.indrelid) as predicate,
           (pg_relation_size(i.indexrelid) / current_setting('block_size')::int)::int as pages
      from pg_index i
      join pg_class c on c.oid = i.indrelid
      join pg_class ic on ic.oid = i.indexrelid
      join pg_am am on am.oid = ic.relam
      join pg_namespace n on n.oid = c.relnamespace
     where n.nspname = 'public' and c.relname in ${sql(tables as string[])} and am.amname = 'btree'
     order by c.relname, ic.relname`
  const out: IndexEntries[] = []
  for (const index of indexes) {
    const [counted] = await sql<{ entries: string; dead: string }[]>`
      with leaves as materialized (
        select blk, s.btpo_next
          from generate_series(1, ${index.pages}::int - 1) blk, lateral bt_page_stats(${index.index}, blk) s
         where s.type = 'l'
      )
      select coalesce(sum(case when i.tids is null then 1 else cardinality(i.tids) end), 0) as entries,
             coalesce(sum(case when i.dead then (case when i.tids is null then 1 else cardinality(i.tids) end) else 0 end), 0) as dead
        from leaves l, lateral bt_page_items(${index.index}, l.blk) i
       where not (l.btpo_next <> 0 and i.itemoffset = 1)`
    // The predicate comes from the catalog (pg_get_expr), the names from pg_class: quoted, not user input.
    const where = index.predicate ? `where ${index.predicate}` : ''
    const [live] = await sql.unsafe<{ n: string }[]>(`select count(*) as n from ${quoteIdent(index.table)} ${where}`)
    const entries = Number(counted!.entries)
    const liveRows = Number(live!.n)
    out.push({ table: index.table, index: index.index, predicate: index.predicate, entries, markedDead: Number(counted!.dead), liveRows, excess: entries - liveRows, pages: index.pages })
  }
  return { ok: true, indexes: out }
}

const quoteIdent = (name: string) => `"${name.replaceAll('"', '""')}"`
