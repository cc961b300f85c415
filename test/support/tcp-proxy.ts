import type { Socket, TCPSocketListener } from 'bun'

/**
 * A TCP proxy between a service and PostgreSQL that can make connections
 * half-open on command, as a network partition or a hung host does: bytes
 * stop flowing in both directions, while both TCP connections stay open. No
 * FIN, no RST, and the proxy's kernel still answers TCP keepalives, so
 * neither the client nor the server learns anything: only timeouts of their
 * own (client-side deadlines, PostgreSQL's statement and idle-in-transaction
 * timeouts) can end what is in flight.
 *
 * - `freeze()`: every open connection stops forwarding; new connections are
 *   accepted and frozen too (a partition: the proxy takes them, the server
 *   never hears of them until the thaw), or let through with
 *   `{ newConnections: 'pass' }`.
 * - `trap(rule)`: one-shot, armed now. When a client sends the statement
 *   `rule.before` matches (its Parse, its Bind of a prepared statement, or a
 *   simple Query), the proxy freezes before forwarding that message: the
 *   server has executed everything sent before it and never sees it.
 *   `scope: 'connection'` freezes only that connection (one half-open
 *   connection), `'all'` freezes everything as `freeze()` does. This is how a
 *   test cuts a completing transaction between two of its statements.
 * - `thaw()`: delivers what was held, in order (as TCP would after the
 *   partition heals), then the closes that happened meanwhile (a close is
 *   never passed on while frozen: a client that gives up on a frozen
 *   connection leaves its server backend waiting, as across a partition).
 * - `stop()`: closes everything at once.
 *
 * Only the client-to-server stream is parsed (PostgreSQL v3 protocol message
 * framing, to find statement boundaries); the server's answers are forwarded
 * or held as raw bytes. No TLS: the test URLs have no sslmode.
 */
export interface TcpProxy {
  /** `databaseUrl` with its host and port replaced by the proxy's. */
  readonly url: string
  readonly port: number
  /** Connections accepted, still open on either side, and currently frozen. */
  readonly counts: { readonly accepted: number; readonly open: number; readonly frozen: number }
  freeze(options?: FreezeOptions): void
  trap(rule: TrapRule): Promise<TrapHit>
  thaw(): void
  stop(): void
}

export interface FreezeOptions {
  /** What happens to connections accepted while frozen. @default 'freeze' */
  readonly newConnections?: 'freeze' | 'pass'
}

export interface TrapRule {
  /** Which connections the trap watches, by their startup parameters (application_name, user, ...). @default all */
  readonly connection?: (startup: Readonly<Record<string, string>>) => boolean
  /** Freeze just before the client sends a statement whose text this matches. */
  readonly before: RegExp
  /** @default 'connection' */
  readonly scope?: 'connection' | 'all'
  /** With scope 'all': what happens to connections accepted afterwards. @default 'freeze' */
  readonly newConnections?: 'freeze' | 'pass'
}

export interface TrapHit {
  /** The trapped connection's startup parameters: application_name tells whose it is. */
  readonly startup: Readonly<Record<string, string>>
  /** The statement that was held back. */
  readonly statement: string
  /** Date.now() when it fired. */
  readonly at: number
}

const PROTOCOL_3 = 196_608
const decoder = new TextDecoder()

interface Pair {
  readonly id: number
  frozen: boolean
  client: Socket<Pair>
  upstream?: Socket<undefined>
  /** Client bytes not yet parsed into whole messages (or held while frozen). */
  inbox: Uint8Array
  /** Server bytes held while frozen. */
  held: Uint8Array[]
  /** Bytes written but not yet accepted by the socket (backpressure), per direction. */
  toServer: Uint8Array[]
  toClient: Uint8Array[]
  startedUp: boolean
  /** The server side was asked for (it is not, for a connection accepted while frozen). */
  connecting: boolean
  startup: Record<string, string>
  /** Prepared statement name -> text, from the client's Parse messages. */
  statements: Map<string, string>
  clientClosed: boolean
  upstreamClosed: boolean
  done: boolean
}

interface ArmedTrap {
  readonly rule: TrapRule
  readonly fire: (hit: TrapHit) => void
}

export async function startTcpProxy(databaseUrl: string): Promise<TcpProxy> {
  const target = new URL(databaseUrl)
  const targetPort = Number(target.port || 5432)
  const pairs = new Set<Pair>()
  let accepted = 0
  let freezeNew = false
  let traps: ArmedTrap[] = []

  const concat = (a: Uint8Array, b: Uint8Array): Uint8Array => {
    if (a.length === 0) return b
    const out = new Uint8Array(a.length + b.length)
    out.set(a)
    out.set(b, a.length)
    return out
  }

  /** Writes with backpressure: what the socket does not take now goes out on `drain`, in order. */
  const send = (socket: Socket<any> | undefined, queue: Uint8Array[], bytes: Uint8Array) => {
    if (bytes.length === 0) return
    queue.push(bytes)
    if (socket) flush(socket, queue)
  }
  const flush = (socket: Socket<any>, queue: Uint8Array[]) => {
    while (queue.length > 0) {
      const chunk = queue[0]!
      const written = socket.write(chunk)
      if (written < 0) return // closed
      if (written < chunk.length) {
        queue[0] = chunk.subarray(written)
        return
      }
      queue.shift()
    }
  }

  const finish = (pair: Pair) => {
    if (pair.done) return
    pair.done = true
    pairs.delete(pair)
    if (!pair.clientClosed) pair.client.end()
    if (!pair.upstreamClosed) pair.upstream?.end()
  }

  /** A closed side is passed on only while not frozen: a partition hides closes too. */
  const propagateCloses = (pair: Pair) => {
    if (pair.frozen || pair.done) return
    if (pair.upstreamClosed || (pair.clientClosed && (pair.upstream || !pair.connecting))) finish(pair)
  }

  const freezePair = (pair: Pair) => { pair.frozen = true }

  /** The statement text a client message carries or refers to, if any. */
  const statementOf = (pair: Pair, type: number, body: Uint8Array): string | undefined => {
    const cstrings = (count: number): string[] => {
      const out: string[] = []
      let at = 0
      for (let i = 0; i < count; i++) {
        const end = body.indexOf(0, at)
        if (end < 0) return out
        out.push(decoder.decode(body.subarray(at, end)))
        at = end + 1
      }
      return out
    }
    if (type === 0x51 /* Q */) return cstrings(1)[0]
    if (type === 0x50 /* P */) {
      const [name, text] = cstrings(2)
      if (name !== undefined && text !== undefined) {
        if (name !== '') pair.statements.set(name, text)
        return text
      }
      return undefined
    }
    if (type === 0x42 /* B */) {
      const [, name] = cstrings(2)
      return name === undefined ? undefined : pair.statements.get(name)
    }
    return undefined
  }

  const checkTraps = (pair: Pair, statement: string): boolean => {
    const trap = traps.find(({ rule }) => rule.before.test(statement) && (rule.connection?.(pair.startup) ?? true))
    if (!trap) return false
    traps = traps.filter((t) => t !== trap)
    if ((trap.rule.scope ?? 'connection') === 'all') freezeAll(trap.rule.newConnections ?? 'freeze')
    else freezePair(pair)
    trap.fire({ startup: { ...pair.startup }, statement, at: Date.now() })
    return true
  }

  /** Forwards the client's whole messages until a trap fires or the pair is frozen. */
  const pumpToServer = (pair: Pair) => {
    let at = 0
    const buffer = pair.inbox
    while (!pair.frozen) {
      if (!pair.startedUp) {
        // Untyped startup-phase messages: SSLRequest / GSSENCRequest / CancelRequest / StartupMessage.
        if (buffer.length - at < 8) break
        const view = new DataView(buffer.buffer, buffer.byteOffset + at)
        const length = view.getInt32(0)
        if (buffer.length - at < length) break
        if (view.getInt32(4) === PROTOCOL_3) {
          pair.startedUp = true
          const parts = decoder.decode(buffer.subarray(at + 8, at + length)).split('\u0000')
          for (let i = 0; i + 1 < parts.length && parts[i] !== ''; i += 2) pair.startup[parts[i]!] = parts[i + 1]!
        }
        at += length
        continue
      }
      if (buffer.length - at < 5) break
      const type = buffer[at]!
      const length = new DataView(buffer.buffer, buffer.byteOffset + at + 1).getInt32(0)
      if (buffer.length - at < 1 + length) break
      const statement = statementOf(pair, type, buffer.subarray(at + 5, at + 1 + length))
      if (statement !== undefined && traps.length > 0 && checkTraps(pair, statement)) break
      at += 1 + length
    }
    send(pair.upstream, pair.toServer, buffer.subarray(0, at))
    pair.inbox = buffer.subarray(at)
  }

  const pumpToClient = (pair: Pair) => {
    if (pair.frozen) return
    for (const chunk of pair.held.splice(0)) send(pair.client, pair.toClient, chunk)
  }

  const freezeAll = (newConnections: 'freeze' | 'pass') => {
    freezeNew = newConnections === 'freeze'
    for (const pair of pairs) freezePair(pair)
  }

  /**
   * Opens the server side. A connection accepted while frozen gets none until
   * the thaw: its SYN never "reaches" the server, which then spends no backend
   * slot on it (the test database server is shared).
   */
  const connectUpstream = (pair: Pair) => {
    pair.connecting = true
    Bun.connect<undefined>({
      hostname: target.hostname,
      port: targetPort,
      socket: {
        data(_upstream, chunk) {
          pair.held.push(new Uint8Array(chunk)) // a copy: Bun may reuse the buffer
          pumpToClient(pair)
        },
        drain(upstream) { flush(upstream, pair.toServer) },
        close() { pair.upstreamClosed = true; propagateCloses(pair) },
        error() { pair.upstreamClosed = true; propagateCloses(pair) },
      },
    }).then((upstream) => {
      pair.upstream = upstream
      if (pair.done) return void upstream.end()
      flush(upstream, pair.toServer)
      pumpToServer(pair)
      propagateCloses(pair)
    }, () => { pair.upstreamClosed = true; propagateCloses(pair) })
  }

  const listener: TCPSocketListener<Pair> = Bun.listen<Pair>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(client) {
        const pair: Pair = {
          id: accepted++, frozen: freezeNew, client, inbox: new Uint8Array(0), held: [], toServer: [], toClient: [],
          startedUp: false, startup: {}, statements: new Map(), connecting: false, clientClosed: false, upstreamClosed: false, done: false,
        }
        client.data = pair
        pairs.add(pair)
        if (!pair.frozen) connectUpstream(pair)
      },
      data(client, chunk) {
        const pair = client.data
        pair.inbox = concat(pair.inbox, new Uint8Array(chunk))
        if (pair.upstream) pumpToServer(pair)
      },
      drain(client) { flush(client, client.data.toClient) },
      close(client) { client.data.clientClosed = true; propagateCloses(client.data) },
      error(client) { client.data.clientClosed = true; propagateCloses(client.data) },
    },
  })

  const url = new URL(databaseUrl)
  url.hostname = '127.0.0.1'
  url.port = String(listener.port)

  return {
    url: url.toString(),
    port: listener.port,
    get counts() {
      let frozen = 0
      for (const pair of pairs) if (pair.frozen) frozen++
      return { accepted, open: pairs.size, frozen }
    },
    freeze(options = {}) {
      freezeAll(options.newConnections ?? 'freeze')
    },
    trap(rule) {
      return new Promise<TrapHit>((resolve) => { traps.push({ rule, fire: resolve }) })
    },
    thaw() {
      freezeNew = false
      for (const pair of [...pairs]) {
        pair.frozen = false
        if (!pair.connecting && !pair.clientClosed) connectUpstream(pair)
        if (pair.upstream) pumpToServer(pair)
        pumpToClient(pair)
        propagateCloses(pair)
      }
    },
    stop() {
      traps = []
      listener.stop(true)
      for (const pair of [...pairs]) {
        pair.done = true
        pairs.delete(pair)
        pair.client.terminate()
        pair.upstream?.terminate()
      }
    },
  }
}
