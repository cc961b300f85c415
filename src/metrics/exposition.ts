import type { Registry } from 'prom-client'
import type { ClusterMetrics } from './cluster'
import type { DatabaseGauges } from './gauges'

export interface ExpositionSources {
  /** This process' counters, histograms and process metrics. */
  readonly registry: Registry
  /** The gauges computed in PostgreSQL: global, added once, never summed. */
  readonly gauges?: DatabaseGauges | undefined
  /** With WORKERS>1: the per-process metrics summed over all workers. */
  readonly cluster?: ClusterMetrics | undefined
}

/** The text answered at GET /metrics (Prometheus text format 0.0.4). */
export async function exposition(sources: ExpositionSources): Promise<string> {
  const [perProcess] = await Promise.all([
    sources.cluster ? sources.cluster.metrics() : sources.registry.metrics(),
    sources.gauges?.refresh(),
  ])
  const global = sources.gauges ? await sources.gauges.registry.metrics() : ''
  return joinExpositions(perProcess, global)
}

function joinExpositions(...texts: string[]): string {
  return texts.filter((text) => text.trim() !== '').map((text) => text.endsWith('\n') ? text : `${text}\n`).join('')
}
