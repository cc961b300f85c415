import { readFileSync } from 'node:fs'
import { OUTPUTS } from '../../dashboards/build'

const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'inf', 'nan', 'le'])

/** The metric names a PromQL expression reads (functions, keywords, labels and strings left out). */
export function metricNames(expr: string): string[] {
  const labelValues = /^\s*label_values\(\s*([^,]+?)\s*(,[^)]*)?\)\s*$/.exec(expr)
  let text = labelValues ? labelValues[1]! : expr
  text = text
    .replace(/"(?:[^"\\]|\\.)*"/g, '""') // string literals (label values, regexes)
    .replace(/\{[^}]*\}/g, ' ') // label matchers
    .replace(/\[[^\]]*\]/g, ' ') // range selectors
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ') // grouping label lists
  const names: string[] = []
  for (const match of text.matchAll(/(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const rest = text.slice(match.index! + match[0].length).trimStart()
    if (rest.startsWith('(') || KEYWORDS.has(match[0].toLowerCase())) continue
    names.push(match[0])
  }
  return names
}

/** Every PromQL expression in the generated files, with where it comes from. */
export function generatedExpressions(): { where: string; expr: string }[] {
  const found: { where: string; expr: string }[] = []
  const dashboard = JSON.parse(readFileSync(OUTPUTS.dashboard, 'utf8'))
  for (const panel of dashboard.panels ?? [])
    for (const target of panel.targets ?? []) found.push({ where: `dashboard panel "${panel.title}" ${target.refId}`, expr: target.expr })
  for (const variable of dashboard.templating?.list ?? [])
    if (variable.type === 'query') found.push({ where: `dashboard variable ${variable.name}`, expr: variable.query })
  const grafana = Bun.YAML.parse(readFileSync(OUTPUTS.grafanaAlerts, 'utf8')) as any
  for (const group of grafana.groups)
    for (const rule of group.rules)
      for (const query of rule.data)
        if (query.datasourceUid !== '__expr__') found.push({ where: `Grafana rule ${rule.title}`, expr: query.model.expr })
  const prometheus = Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any
  for (const group of prometheus.groups)
    for (const rule of group.rules) found.push({ where: `Prometheus rule ${rule.alert}`, expr: rule.expr })
  return found
}

/** Names a text exposition declares: every family (# TYPE) and every sample name. */
export function exportedNames(exposition: string): Set<string> {
  const names = new Set<string>()
  for (const line of exposition.split('\n')) {
    const type = /^# TYPE (\S+) (\w+)/.exec(line)
    if (type) {
      names.add(type[1]!)
      if (type[2] === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(type[1]! + suffix)
      continue
    }
    const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(line)
    if (sample) names.add(sample[1]!)
  }
  return names
}
