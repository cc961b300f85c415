/**
 * WORKERS>1: N Bun processes serve the same port (SO_REUSEPORT spreads the
 * connections). This process only supervises: it forwards SIGTERM/SIGINT and
 * exits after every worker has drained, so the embedded database stops last.
 */
export async function superviseWorkers(count: number, env: Record<string, string | undefined>, log: (line: string) => void): Promise<number> {
  const workers = Array.from({ length: count }, () =>
    Bun.spawn([process.execPath, import.meta.dir + '/main.ts'], { env, stdio: ['ignore', 'inherit', 'inherit'] }))
  log(`started ${count} workers: ${workers.map((w) => w.pid).join(', ')}`)
  let stopping = false
  const forward = (signal: NodeJS.Signals) => () => {
    if (stopping) return
    stopping = true
    log(`${signal}: stopping workers`)
    for (const worker of workers) worker.kill(signal)
  }
  process.on('SIGTERM', forward('SIGTERM')).on('SIGINT', forward('SIGINT'))
  const codes = await Promise.all(workers.map((worker) => worker.exited))
  if (!stopping) log(`a worker exited on its own (codes ${codes.join(', ')})`)
  return codes.every((code) => code === 0) ? 0 : 1
}
