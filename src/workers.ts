/**
 * WORKERS>1: N Bun processes serve the same port (SO_REUSEPORT: the kernel
 * spreads new connections over them). This process only supervises: it
 * forwards SIGTERM/SIGINT, restarts a worker that dies on its own, and exits
 * after every worker has drained, so the embedded database stops last.
 *
 * Why restart rather than stop everything when a worker dies: the keys it held
 * are safe either way (its transactions rolled back with its connections; the
 * keys become reclaimable after the TTL, and fencing stops it from committing
 * anything late), so stopping would only turn one crash into a full outage.
 * But a worker that keeps dying points at something systematic (bad config,
 * database refusing us, a poison request): after MAX_RESTARTS within
 * RESTART_WINDOW_MS the supervisor stops all workers and exits 1, so that the
 * orchestrator sees the failure instead of a quiet crash loop.
 */
import type { Subprocess } from 'bun'
import { MetricsHub } from './metrics/cluster'
import type { Logger } from './log'

/** 5 crashes a minute: far above an occasional crash, low enough to give up on a loop within seconds. */
const MAX_RESTARTS = 5
const RESTART_WINDOW_MS = 60_000
/** A short pause before a restart, so a crash on start does not spin the CPU. */
const RESTART_DELAY_MS = 250

export interface SuperviseOptions {
  readonly count: number
  readonly env: Record<string, string | undefined>
  readonly log: Logger
  /** Aborted (reason: the signal's name) when this process is told to stop; main.ts listens from its first line. */
  readonly stop: AbortSignal
}

/**
 * A worker told to stop exits 0 once it has drained; one told while still
 * booting (before its first line of JavaScript can install a handler) dies of
 * the signal itself. Both are the clean stop we asked for.
 */
function stoppedAsTold(code: number, signal: NodeJS.Signals | number | null): boolean {
  return code === 0 || signal === 'SIGTERM' || signal === 'SIGINT'
}

export async function superviseWorkers({ count, env, log, stop }: SuperviseOptions): Promise<number> {
  // Every worker until its exit is judged (a dead one stays a moment, see below).
  const workers = new Set<Subprocess>()
  // Sums the workers' counters for /metrics (see metrics/cluster.ts).
  const metricsHub = new MetricsHub()
  const restarts: number[] = []
  let stopping: NodeJS.Signals | undefined
  let failed = false
  let settle: () => void = () => undefined
  const allGone = new Promise<void>((resolve) => { settle = resolve })

  const stopAll = (signal: NodeJS.Signals) => {
    for (const worker of workers) if (worker.exitCode === null && worker.signalCode === null) worker.kill(signal)
  }

  const judge = (worker: Subprocess, code: number): void => {
    workers.delete(worker)
    const how = worker.signalCode ?? code
    if (stopping === undefined) {
      const now = Date.now()
      while (restarts.length > 0 && restarts[0]! < now - RESTART_WINDOW_MS) restarts.shift()
      if (restarts.length < MAX_RESTARTS) {
        restarts.push(now)
        log.error(`worker ${worker.pid} exited on its own (${how}); restarting it`, { worker_pid: worker.pid, exit: String(how) })
        start()
        return
      }
      log.error(`worker ${worker.pid} exited (${how}); ${MAX_RESTARTS} restarts within ${RESTART_WINDOW_MS / 1000} s: stopping all`, { worker_pid: worker.pid, exit: String(how) })
      failed = true
      stopping = 'SIGTERM'
      stopAll('SIGTERM')
    } else if (!stoppedAsTold(code, worker.signalCode)) {
      log.error(`worker ${worker.pid} failed while stopping (${how})`, { worker_pid: worker.pid, exit: String(how) })
      failed = true
    } else if (worker.signalCode !== null) {
      log.info(`worker ${worker.pid} stopped by ${worker.signalCode} while booting`, { worker_pid: worker.pid })
    }
    if (workers.size === 0) settle()
  }

  const start = (): void => {
    const worker = Bun.spawn([process.execPath, import.meta.dir + '/main.ts'], { env, stdio: ['ignore', 'inherit', 'inherit'], ipc: metricsHub.onMessage })
    workers.add(worker)
    metricsHub.track(worker)
    // Judged after a short pause, not at once: it keeps a crash on start from
    // spinning the CPU, and a signal to the whole group kills a worker still
    // booting as it reaches us, so our handler has run by then and the exit
    // counts as the stop it is, not as a crash to restart.
    void worker.exited.then((code) => setTimeout(() => judge(worker, code), stopping === undefined ? RESTART_DELAY_MS : 0))
  }

  for (let i = 0; i < count; i++) start()
  log.info(`started ${count} workers: ${[...workers].map((w) => w.pid).join(', ')}`, { workers: count })

  // A signal to the whole process group reaches the workers directly too; a
  // second SIGTERM is harmless to a draining worker (it ignores it).
  const forward = () => {
    if (stopping !== undefined) return
    stopping = stop.reason === 'SIGINT' ? 'SIGINT' : 'SIGTERM'
    log.info(`${stopping}: stopping ${workers.size} worker(s)`, { signal: stopping })
    stopAll(stopping)
    if (workers.size === 0) settle()
  }
  if (stop.aborted) forward()
  else stop.addEventListener('abort', forward, { once: true })
  await allGone
  log.info('all workers stopped')
  return failed ? 1 : 0
}

/**
 * The port the workers share. PORT=0 ("any free port", tests only) would give
 * every worker a different port, so the supervisor picks one for all of them.
 */
export function sharedPort(host: string, port: number): number {
  if (port !== 0) return port
  const probe = Bun.serve({ hostname: host, port: 0, fetch: () => new Response(null) })
  const chosen = probe.port!
  probe.stop(true)
  return chosen
}
