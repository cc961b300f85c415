/**
 * One etcd (Debian's etcd-server, 3.4) for a Patroni cluster: the DCS that
 * holds the leader lock. Started by the test on free loopback ports with its
 * data in a temp dir, in a process group of its own, registered for cleanup.
 * One member is enough here: the scenarios fault PostgreSQL and Patroni, not
 * the DCS (an etcd quorum is a deployment's business, not this suite's).
 */
import { join } from 'node:path'
import { asServiceUser, bounded, STOP_MS, findBinary, freePort, killGroup, start, tempDir, waitFor, type Started } from './processes'

export class Etcd {
  private constructor(readonly clientPort: number, readonly running: Started) {}

  static async start(): Promise<Etcd> {
    const binary = findBinary('etcd')
    if (!binary) throw new Error('etcd not found (apt-get install -y etcd-server)')
    const dir = tempDir('etcd')
    const clientPort = freePort()
    const peerPort = freePort()
    const client = `http://127.0.0.1:${clientPort}`
    const peer = `http://127.0.0.1:${peerPort}`
    const running = start(asServiceUser([
      binary, '--name', 'scale', '--data-dir', join(dir, 'data'),
      '--listen-client-urls', client, '--advertise-client-urls', client,
      '--listen-peer-urls', peer, '--initial-advertise-peer-urls', peer,
      '--initial-cluster', `scale=${peer}`, '--initial-cluster-state', 'new',
      '--logger', 'zap', '--log-level', 'warn',
    ]))
    const etcd = new Etcd(clientPort, running)
    await waitFor(`etcd on ${clientPort}`, async () => {
      if (running.proc.exitCode !== null) throw new Error(`etcd exited ${running.proc.exitCode}:\n${running.output()}`)
      return (await fetch(`${client}/health`).catch(() => undefined))?.ok === true
    }, 30_000, 100)
    return etcd
  }

  get url(): string {
    return `http://127.0.0.1:${this.clientPort}`
  }

  async stop(): Promise<void> {
    killGroup(this.running.proc.pid, 'SIGTERM')
    await bounded(`etcd (pid ${this.running.proc.pid}) to exit after SIGTERM`, this.running.proc.exited, STOP_MS)
  }
}
