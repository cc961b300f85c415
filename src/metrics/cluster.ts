import { AggregatorRegistry, type MetricObjectWithValues, type MetricValue, type Registry } from 'prom-client'
import type { Subprocess } from 'bun'

/**
 * WORKERS>1: N processes share one port (SO_REUSEPORT), so a scrape of
 * /metrics lands on one worker at random. Its own counters are a fraction of
 * the truth, a different fraction each time: rate() of that is noise, and a
 * `pid` label cannot help, since Prometheus cannot pick the worker it reaches.
 *
 * So the worker that gets the scrape asks the supervisor, the supervisor asks
 * every worker for its registry as JSON over the IPC channel, and sums them
 * with prom-client's AggregatorRegistry (counters and histograms are summed,
 * process gauges use each metric's own aggregator). The database gauges are
 * not part of this: they are global, and the answering worker adds its own.
 *
 * A worker that does not answer in time is counted with its last answer, so a
 * sum never drops (a drop would read as a counter reset and spike rate()).
 */

/** 1 s: a worker answers in well under a millisecond unless its event loop is stuck; a scrape must still answer. */
export const COLLECT_TIMEOUT_MS = 1_000

const ASK = 'idempotent-post:metrics-ask'
const COLLECT = 'idempotent-post:metrics-collect'
const REPLY = 'idempotent-post:metrics-reply'
const AGGREGATED = 'idempotent-post:metrics-aggregated'

type MetricsJson = MetricObjectWithValues<MetricValue<string>>[]
type Message =
  | { type: typeof ASK; id: number }
  | { type: typeof COLLECT; id: number }
  | { type: typeof REPLY; id: number; metrics: MetricsJson }
  | { type: typeof AGGREGATED; id: number; text?: string; error?: string }

function isMessage(value: unknown): value is Message {
  return typeof value === 'object' && value !== null && typeof (value as { type?: unknown }).type === 'string'
    && (value as { type: string }).type.startsWith('idempotent-post:metrics-')
}

/** The supervisor's side: answers a worker's ask with the sum over all workers. */
export class MetricsHub {
  private readonly live = new Set<Subprocess>()
  /** Each worker's last answer, by pid; kept after it exits (its counters only). */
  private readonly last = new Map<number, MetricsJson>()
  private readonly pending = new Map<number, { waiting: Set<number>; replies: Map<number, MetricsJson>; finish: () => void }>()
  private nextId = 0

  /**
   * Call for every worker spawned with `ipc: hub.onMessage`. When it exits,
   * its last counters and histograms stay in the sum (a restart must not look
   * like a counter reset); its gauges leave with it.
   */
  track(worker: Subprocess): void {
    this.live.add(worker)
    void worker.exited.then(() => {
      this.live.delete(worker)
      const last = this.last.get(worker.pid)
      if (last) this.last.set(worker.pid, last.filter((metric) => ['counter', 'histogram'].includes(String(metric.type))))
    })
  }

  /** Pass as Bun.spawn's `ipc` option. */
  readonly onMessage = (message: unknown, worker: Subprocess): void => {
    if (!isMessage(message)) return
    if (message.type === ASK) void this.aggregateFor(worker, message.id)
    if (message.type === REPLY) {
      if (this.live.has(worker)) this.last.set(worker.pid, message.metrics)
      const round = this.pending.get(message.id)
      if (!round) return
      round.replies.set(worker.pid, message.metrics)
      round.waiting.delete(worker.pid)
      if (round.waiting.size === 0) round.finish()
    }
  }

  private async aggregateFor(asker: Subprocess, askId: number): Promise<void> {
    const id = this.nextId++
    const live = [...this.live]
    const replies = new Map<number, MetricsJson>()
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, COLLECT_TIMEOUT_MS)
      const finish = () => { clearTimeout(timer); resolve() }
      this.pending.set(id, { waiting: new Set(live.map((worker) => worker.pid)), replies, finish })
      for (const worker of live) {
        try { worker.send({ type: COLLECT, id } satisfies Message) } catch { /* gone: its last answer counts */ }
      }
    })
    this.pending.delete(id)
    // Late and exited workers count with their last answer, so sums never drop.
    const all = [...this.last.entries()].map(([pid, metrics]) => replies.get(pid) ?? metrics)
    let reply: Message
    try {
      reply = { type: AGGREGATED, id: askId, text: await AggregatorRegistry.aggregate(all).metrics() }
    } catch (error) {
      reply = { type: AGGREGATED, id: askId, error: error instanceof Error ? error.message : String(error) }
    }
    try { asker.send(reply) } catch { /* the asker is gone */ }
  }
}

/** A worker's side: answers the supervisor's collect, and asks it for the sum when scraped. */
export class ClusterMetrics {
  private readonly waiting = new Map<number, (answer: { text?: string; error?: string }) => void>()
  private nextId = 0
  private readonly listener = (message: unknown): void => {
    if (!isMessage(message)) return
    if (message.type === COLLECT) {
      void this.registry.getMetricsAsJSON()
        .then((metrics) => { process.send?.({ type: REPLY, id: message.id, metrics: metrics as MetricsJson } satisfies Message) })
        .catch(() => undefined) // the supervisor is gone; the worker's own drain takes it from here
    }
    if (message.type === AGGREGATED) this.waiting.get(message.id)?.(message)
  }

  constructor(private readonly registry: Registry) {
    process.on('message', this.listener)
  }

  /** True in a worker started by the supervisor with an IPC channel. */
  static available(): boolean {
    return typeof process.send === 'function'
  }

  /**
   * The per-process metrics summed over all workers. Throws when the
   * supervisor does not answer: a failed scrape is a gap in the graphs, while
   * this worker's own share would read as a counter reset.
   */
  async metrics(): Promise<string> {
    const id = this.nextId++
    const answer = await new Promise<{ text?: string; error?: string } | undefined>((resolve) => {
      const timer = setTimeout(() => resolve(undefined), COLLECT_TIMEOUT_MS * 2)
      this.waiting.set(id, (message) => { clearTimeout(timer); resolve(message) })
      try { process.send?.({ type: ASK, id } satisfies Message) } catch { resolve(undefined) }
    })
    this.waiting.delete(id)
    if (answer?.text === undefined) throw new Error(`metrics aggregation failed: ${answer?.error ?? 'the supervisor did not answer'}`)
    return answer.text
  }

  close(): void {
    process.off('message', this.listener)
  }
}
