/**
 * The "network" between a primary and its standby: a loopback TCP relay the
 * test controls. `hold()` stops delivering bytes (a slow link: the standby
 * lags, and a synchronous primary cannot get its acknowledgements), and
 * `cut()` drops what was held and every connection (the link is gone with the
 * crashed host). Stopping the WAL receiver with SIGSTOP is not enough: what
 * the primary sent waits in the kernel's socket buffer and arrives on SIGCONT.
 */
import net from 'node:net'
import { freePort } from './processes'

export class TcpRelay {
  #held = false
  #cut = false
  readonly #pending: (() => void)[] = []
  readonly #sockets = new Set<net.Socket>()

  private constructor(readonly port: number, readonly server: net.Server) {}

  static async start(targetPort: number): Promise<TcpRelay> {
    const port = freePort()
    let relay: TcpRelay
    const server = net.createServer((client) => relay.#accept(client, targetPort))
    relay = new TcpRelay(port, server)
    await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve))
    return relay
  }

  #accept(client: net.Socket, targetPort: number): void {
    if (this.#cut) return void client.destroy()
    const upstream = net.connect(targetPort, '127.0.0.1')
    this.#sockets.add(client).add(upstream)
    const forward = (from: net.Socket, to: net.Socket) => {
      from.on('data', (chunk) => {
        if (this.#cut) return
        if (this.#held) this.#pending.push(() => to.write(chunk))
        else to.write(chunk)
      })
      from.on('close', () => { this.#sockets.delete(from); to.destroy() })
      from.on('error', () => to.destroy())
    }
    forward(client, upstream)
    forward(upstream, client)
  }

  /** Bytes stop moving, both ways; nothing is lost yet. */
  hold(): void {
    this.#held = true
  }

  /** What was held is delivered, in order. */
  release(): void {
    this.#held = false
    for (const send of this.#pending.splice(0)) send()
  }

  /** The link is gone: what was held is dropped, every connection closed, new ones refused. */
  cut(): void {
    this.#cut = true
    this.#pending.length = 0
    for (const socket of this.#sockets) socket.destroy()
    this.#sockets.clear()
  }

  async stop(): Promise<void> {
    this.cut()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
  }
}
