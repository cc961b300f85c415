/**
 * `npm run bench:scale`: the figures of docs/explanation/scaling.md that no test guards
 * (the scale suite, `npm run test:scale`, asserts properties; this measures).
 * One run, printed as Markdown. Sections can be chosen by name:
 * `npm run bench:scale -- capacity haproxy relay patroni` (all by default).
 */
import { capacity } from './capacity'
import { patroniFailovers, relayFailovers } from './failover'
import { haproxyLatency } from './haproxy'
import { markdown, type Section } from './report'

const SECTIONS: Record<string, () => Promise<Section>> = {
  capacity,
  haproxy: haproxyLatency,
  relay: relayFailovers,
  patroni: patroniFailovers,
}

const chosen = process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(SECTIONS)
const unknown = chosen.filter((name) => !(name in SECTIONS))
if (unknown.length) {
  process.stderr.write(`unknown section(s) ${unknown.join(', ')}; choose from ${Object.keys(SECTIONS).join(', ')}\n`)
  process.exit(2)
}
const out: string[] = [`## npm run bench:scale (${new Date().toISOString()}, ${navigator.hardwareConcurrency} cores)`, '']
for (const name of chosen) {
  const started = performance.now()
  const section = await SECTIONS[name]!()
  out.push(markdown(section), `(${name}: ${((performance.now() - started) / 1000).toFixed(0)} s)`, '')
  process.stdout.write(`${markdown(section)}\n`)
}
process.stdout.write(`\n${out.join('\n')}\n`)
process.exit(0)
