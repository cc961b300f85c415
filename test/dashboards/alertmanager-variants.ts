/**
 * The Alertmanager configuration the drills run (prometheus-drills.test.ts):
 * dashboards/alertmanager.yml as generated, its receivers pointed at the
 * test's webhook (one path per severity), and a second job's sub-route and
 * inhibit rules merged into it as an operator merges them into a tree of
 * their own. Nothing else is changed: every timing is the shipped one.
 *
 * `ALERTMANAGER_DRILL_VARIANT` runs the drills against a broken copy, to
 * watch them fail (issue 43):
 * - `no-inhibition`: the shipped routes without the inhibit rules;
 * - `default-timings`: the inhibit rules kept, and Alertmanager's default
 *   timings on every route (group_wait 30 s, group_interval 5 m,
 *   repeat_interval 4 h);
 * - `defaults`: both (no inhibit rules, default timings);
 * - `one-route`: one receiver for everything (no route per severity).
 */
import { alertmanagerConfig, inhibitRules, jobRoute, receivers } from '../../dashboards/alertmanager'

const VARIANTS = ['shipped', 'no-inhibition', 'default-timings', 'defaults', 'one-route'] as const
export type Variant = typeof VARIANTS[number]

export function drillVariant(env: Record<string, string | undefined> = process.env): Variant {
  const variant = env.ALERTMANAGER_DRILL_VARIANT?.trim() || 'shipped'
  if (!(VARIANTS as readonly string[]).includes(variant)) throw new Error(`ALERTMANAGER_DRILL_VARIANT must be one of ${VARIANTS.join(', ')}, got ${JSON.stringify(variant)}`)
  return variant as Variant
}

type Route = { receiver?: string; routes?: Route[]; group_wait?: string; group_interval?: string; repeat_interval?: string; group_by?: string[]; matchers?: string[] }

/** `webhook`/page and `webhook`/ticket as the receivers; `jobs[0]` as generated, the others merged in. */
export function drillAlertmanagerConfig(webhook: string, jobs: readonly [string, ...string[]], variant: Variant = 'shipped') {
  const config = alertmanagerConfig({ adminUrl: 'http://127.0.0.1:3000', job: jobs[0] })
  for (const job of jobs.slice(1)) {
    config.route.routes.push(jobRoute(job))
    config.inhibit_rules.push(...inhibitRules(job))
  }
  const drill = { ...config, receivers: receivers({ page: `${webhook}/page`, ticket: `${webhook}/ticket` }) }
  if (variant === 'shipped') return drill
  if (variant === 'one-route') {
    const flatten = (route: Route): Route => ({ ...route, receiver: 'idempotency-page', routes: [] })
    return { ...drill, route: { ...drill.route, routes: drill.route.routes.map(flatten) } }
  }
  const defaults = (route: Route): Route => {
    const { group_wait: _wait, group_interval: _interval, repeat_interval: _repeat, routes, ...rest } = route
    return { ...rest, ...(routes ? { routes: routes.map(defaults) } : {}) }
  }
  return {
    ...drill,
    inhibit_rules: variant === 'default-timings' ? drill.inhibit_rules : [],
    route: variant === 'no-inhibition' ? drill.route : defaults(drill.route as Route),
  }
}
