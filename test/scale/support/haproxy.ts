/**
 * HAProxy (Debian's 2.6) in HTTP mode in front of service instances, started
 * by the test on a free port: round robin, /readyz health checks every
 * 500 ms, and a retry on another instance only when the connection could not
 * be made (the request never left HAProxy, so retrying a POST is harmless).
 */
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { bounded, STOP_MS, findBinary, freePort, killGroup, start, tempDir, waitFor, type Started } from './processes'

export class HAProxy {
  private constructor(readonly port: number, readonly running: Started) {}

  static async start(backends: { name: string; port: number }[]): Promise<HAProxy> {
    const binary = findBinary('haproxy')
    if (!binary) throw new Error('haproxy not found (apt-get install -y haproxy)')
    const dir = tempDir('haproxy')
    const port = freePort()
    const config = join(dir, 'haproxy.cfg')
    writeFileSync(config, [
      'global',
      '  maxconn 4096',
      'defaults',
      '  mode http',
      '  timeout connect 1s',
      '  timeout client 60s',
      '  timeout server 60s',
      '  timeout http-keep-alive 10s',
      // Retry elsewhere only when no connection could be made: the POST was
      // never sent. Never on a timeout or an empty answer: the instance may
      // have acted on it (the idempotency key makes a client's own retry safe,
      // but that is the client's call, with its key).
      '  retries 2',
      '  retry-on conn-failure',
      '  option redispatch 1',
      'frontend api',
      `  bind 127.0.0.1:${port}`,
      '  default_backend services',
      'backend services',
      '  balance roundrobin',
      // HTTP/1.1 with a Host: HAProxy's default check (HTTP/1.0, no Host) got
      // 500 "Invalid URL" from the service, so every instance was marked down.
      '  option httpchk',
      '  http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost',
      '  http-check expect status 200',
      '  default-server inter 500ms fall 1 rise 2',
      ...backends.map((b) => `  server ${b.name} 127.0.0.1:${b.port} check`),
      '',
    ].join('\n'))
    // -db: foreground, no daemon; HAProxy may run as root (it binds an unprivileged port here).
    const running = start([binary, '-db', '-f', config])
    const proxy = new HAProxy(port, running)
    await waitFor(`HAProxy on ${port} with a healthy backend`, async () => {
      if (running.proc.exitCode !== null) throw new Error(`haproxy exited ${running.proc.exitCode}:\n${running.output()}`)
      return (await fetch(`${proxy.url}/readyz`).catch(() => undefined))?.status === 200
    }, 15_000, 100)
    return proxy
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`
  }

  async stop(): Promise<void> {
    killGroup(this.running.proc.pid, 'SIGTERM')
    await bounded(`HAProxy (pid ${this.running.proc.pid}) to exit after SIGTERM`, this.running.proc.exited, STOP_MS)
  }
}

/** A TCP listener of PrimaryProxy: its servers, each health-checked on another port (its node's Patroni REST API). */
export interface PrimaryListen {
  readonly name: string
  readonly servers: readonly { name: string; port: number; checkPort: number }[]
}

/**
 * HAProxy in TCP mode in front of a Patroni cluster, as Patroni's docs set
 * it up: each listener forwards to the one server whose Patroni answers 200
 * to `GET /primary` (the leader). Checks every 500 ms, down after 2 failures,
 * up after 1 success; `on-marked-down shutdown-sessions` cuts the sessions of
 * a server marked down, so clients reconnect at once (to the new primary)
 * instead of waiting on a demoted or dead one until TCP gives up.
 */
export class PrimaryProxy {
  private constructor(readonly ports: Readonly<Record<string, number>>, readonly running: Started) {}

  static async start(listens: readonly PrimaryListen[]): Promise<PrimaryProxy> {
    const binary = findBinary('haproxy')
    if (!binary) throw new Error('haproxy not found (apt-get install -y haproxy)')
    const dir = tempDir('haproxy-pg')
    const ports = Object.fromEntries(listens.map((l) => [l.name, freePort()]))
    const config = join(dir, 'haproxy.cfg')
    writeFileSync(config, [
      'global',
      '  maxconn 4096',
      'defaults',
      '  mode tcp',
      '  timeout connect 1s',
      // Longer than any idle pooled connection (postgres.js idle_timeout 60 s); keepalives are the database's.
      '  timeout client 30m',
      '  timeout server 30m',
      '  timeout check 1s',
      ...listens.flatMap((l) => [
        `listen ${l.name}`,
        `  bind 127.0.0.1:${ports[l.name]}`,
        '  option httpchk GET /primary',
        '  http-check expect status 200',
        '  default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions',
        ...l.servers.map((s) => `  server ${s.name} 127.0.0.1:${s.port} check port ${s.checkPort}`),
      ]),
      '',
    ].join('\n'))
    const running = start([binary, '-db', '-f', config])
    await waitFor('HAProxy (TCP) to listen', async () => {
      if (running.proc.exitCode !== null) throw new Error(`haproxy exited ${running.proc.exitCode}:\n${running.output()}`)
      const socket = await Bun.connect({ hostname: '127.0.0.1', port: ports[listens[0]!.name]!, socket: { data() {} } }).catch(() => undefined)
      socket?.end()
      return socket !== undefined
    }, 15_000, 100)
    return new PrimaryProxy(ports, running)
  }

  port(listen: string): number {
    const port = this.ports[listen]
    if (port === undefined) throw new Error(`no listener ${listen}`)
    return port
  }

  async stop(): Promise<void> {
    killGroup(this.running.proc.pid, 'SIGTERM')
    await bounded(`HAProxy (pid ${this.running.proc.pid}) to exit after SIGTERM`, this.running.proc.exited, STOP_MS)
  }
}
