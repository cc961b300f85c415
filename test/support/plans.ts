/**
 * The plans PostgreSQL actually ran, for every statement the engine sends:
 * pools whose sessions plan every prepared statement generically
 * (plan_cache_mode = force_generic_plan, as a long-lived connection ends up
 * doing) and report each executed plan back to the client (auto_explain at
 * LOG, client_min_messages = log), nested statements (plpgsql, triggers)
 * included. Superuser-only settings: fine on the suite's own server.
 */
import postgres from 'postgres'
import { SESSION_SETTINGS, type Pool, type Pools } from '../../src/store/db'

export interface PlanNode {
  'Node Type': string
  'Relation Name'?: string
  'Index Name'?: string
  'Index Cond'?: string
  'Recheck Cond'?: string
  'TID Cond'?: string
  Plans?: PlanNode[]
}

/** One table access of one executed statement. */
export interface TableAccess {
  readonly table: string
  readonly node: string
  readonly index: string | undefined
  /** Reached through its index by a condition: a probe or a range, never the whole index. */
  readonly probed: boolean
  readonly query: string
}

export interface PlanCapture {
  readonly pools: Pools
  /** Every access to `tables` in the plans seen so far. */
  accesses(tables: readonly string[]): TableAccess[]
  /** Statements whose plans were seen. */
  readonly statements: () => number
  clear(): void
}

const nodesOf = (plan: PlanNode): PlanNode[] => [plan, ...(plan.Plans ?? []).flatMap(nodesOf)]

export function capturePlans(url: string): PlanCapture {
  const plans: { query: string; plan: PlanNode }[] = []
  const onnotice = (notice: postgres.Notice) => {
    const text = String(notice.message ?? '')
    const at = text.indexOf('plan:\n')
    if (at < 0) return
    const explained = JSON.parse(text.slice(at + 'plan:\n'.length)) as { 'Query Text': string; Plan: PlanNode }
    plans.push({ query: explained['Query Text'], plan: explained.Plan })
  }
  const open = (name: string): Pool => postgres(url, {
    max: 4,
    fetch_types: false,
    onnotice,
    connection: {
      application_name: `test:plans:${name}`,
      ...SESSION_SETTINGS,
      plan_cache_mode: 'force_generic_plan',
      client_min_messages: 'log',
      // A library's own settings given as startup parameters are lost when it loads; as -c options they hold.
      options: ['session_preload_libraries=auto_explain', 'auto_explain.log_min_duration=0',
        'auto_explain.log_nested_statements=on', 'auto_explain.log_format=json'].map((setting) => `-c ${setting}`).join(' '),
    },
  }) as Pool
  const short = open('short')
  const work = open('work')
  return {
    pools: {
      short,
      work,
      async close(timeoutSeconds = 1) {
        await Promise.all([short.end({ timeout: timeoutSeconds }), work.end({ timeout: timeoutSeconds })])
      },
    },
    accesses: (tables) => plans.flatMap(({ query, plan }) => nodesOf(plan)
      // Reads only: a ModifyTable node names its table too.
      .filter((node) => node['Node Type'].endsWith('Scan') && node['Relation Name'] !== undefined && tables.includes(node['Relation Name']))
      .map((node) => ({
        table: node['Relation Name']!,
        node: node['Node Type'],
        // A bitmap heap scan's index is its child's.
        index: node['Index Name'] ?? node.Plans?.find((child) => child['Index Name'])?.['Index Name'],
        probed: node['Index Cond'] !== undefined || node['Recheck Cond'] !== undefined || node['TID Cond'] !== undefined,
        query: query.replace(/\s+/g, ' ').trim().slice(0, 160),
      }))),
    statements: () => plans.length,
    clear: () => { plans.length = 0 },
  }
}
