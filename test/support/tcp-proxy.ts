import type { Socket, TCPSocketListener } from 'bun'
import { flushQueued, sendQueued } from './socket-queue'

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
 *   `action: 'reset'` resets the connection instead (below), so the server
 *   never sees the statement and the client gets ECONNRESET while it waits
 *   for it; `action: 'hold-reply'` lets the server run the statement and
 *   holds back its answer (a lost answer: see HeldReply).
 * - `thaw()`: delivers what was held, in order (as TCP would after the
 *   partition heals), then the closes that happened meanwhile (a close is
 *   never passed on while frozen: a client that gives up on a frozen
 *   connection leaves its server backend waiting, as across a partition).
 * - `reset(filter)`, or `reset()` of one of `connections()`: an abortive
 *   close of both sides (SO_LINGER 0, Bun's `terminate()`), as a middlebox
 *   or a dying host does: the client sees ECONNRESET, not a FIN, and what was
 *   in flight either way is lost. `serverSidePort` of a connection is its
 *   backend's `pg_stat_activity.client_port`, so a test finds the connection
 *   of the backend it sees running a statement.
 * - `stop()`: closes everything at once.
 *
 * Both streams are parsed for PostgreSQL v3 message framing: the client's to
 * find statement boundaries, the server's to tell which ReadyForQuery ends
 * the answer to a trapped statement (one per Sync or simple Query, and one
 * for the startup). No TLS: the test URLs have no sslmode.
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
  /** The connections open now (both sides or either), oldest first. */
  connections(): ProxyConnection[]
  /** Resets (RST) every open connection `filter` picks (all without one); returns them. */
  reset(filter?: (connection: ProxyConnection) => boolean): ProxyConnection[]
  stop(): void
}

/** One client connection through the proxy, and its connection to the server. */
export interface ProxyConnection {
  readonly id: number
  /** Its startup parameters (application_name, user, ...); empty until the client sent them. */
  readonly startup: Readonly<Record<string, string>>
  /** The proxy's local port towards the server: pg_stat_activity.client_port of its backend. Undefined until connected. */
  readonly serverSidePort: number | undefined
  /** False once either side has closed it (or it was reset). */
  readonly open: boolean
  /** An abortive close of both sides (RST): the client sees ECONNRESET; whatever was held or in flight is lost. */
  reset(): void
}

/**
 * The server's answer to a statement trapped with `action: 'hold-reply'`: the
 * server ran it (and, in autocommit, committed it), the client has not heard.
 * Everything the server sends from the answer on is held until `deliver()` or
 * `drop()`; closes are held too, as while frozen.
 */
export interface HeldReply {
  /** Resolves once the whole answer (through its ReadyForQuery) is held. */
  readonly complete: Promise<void>
  /** Loses the answer (now and any part still to come); what the server sends after it (e.g. a FATAL, a close) passes. */
  drop(): void
  /** Passes the answer on, late, and whatever followed it. */
  deliver(): void
}

export interface FreezeOptions {
  /** What happens to connections accepted while frozen. @default 'freeze' */
  readonly newConnections?: 'freeze' | 'pass'
}

export interface TrapRule {
  /** Which connections the trap watches, by their startup parameters (application_name, user, ...) or id (ids grow in accept order). @default all */
  readonly connection?: (startup: Readonly<Record<string, string>>, connection: ProxyConnection) => boolean
  /** Freeze just before the client sends a statement whose text this matches. */
  readonly before: RegExp
  /** @default 'connection' */
  readonly scope?: 'connection' | 'all'
  /** With scope 'all': what happens to connections accepted afterwards. @default 'freeze' */
  readonly newConnections?: 'freeze' | 'pass'
  /**
   * What the trap does when it fires. @default 'freeze'
   * - 'freeze': holds the statement back (and, per `scope`, freezes).
   * - 'reset': resets the connection (RST, see ProxyConnection.reset) instead of forwarding the statement.
   * - 'hold-reply': forwards the statement and holds the server's answer (TrapHit.reply). It fires on the
   *   statement's execution (its Bind, or a simple Query), not on a Parse that only describes it.
   */
  readonly action?: 'freeze' | 'reset' | 'hold-reply'
}

export interface TrapHit {
  /** The trapped connection's startup parameters: application_name tells whose it is. */
  readonly startup: Readonly<Record<string, string>>
  /** The statement that was held back. */
  readonly statement: string
  /** Date.now() when it fired. */
  readonly at: number
  /** The trapped connection (to reset it, or to find its backend by `serverSidePort`). */
  readonly connection: ProxyConnection
  /** With `action: 'hold-reply'`: the held answer. */
  readonly reply?: HeldReply
}

const PROTOCOL_3 = 196_608
/** SSLRequest and GSSENCRequest: the server answers each with one unframed byte. */
const ENCRYPTION_REQUESTS = new Set([80_877_103, 80_877_104])
const SYNC = 0x53
const QUERY = 0x51
const BIND = 0x42
const READY_FOR_QUERY = 0x5a
const decoder = new TextDecoder()

interface Reply {
  /** ReadyForQuery messages the server sent before the answer: the answer is what follows the `after`-th, through the next. */
  readonly after: number
  state: 'holding' | 'dropping' | 'delivered'
  /** Held server messages, each marked as part of the answer or after it. */
  readonly messages: { bytes: Uint8Array; ofReply: boolean }[]
  readonly completed: () => void
}

interface Pair {
  readonly id: number
  frozen: boolean
  client: Socket<Pair>
  upstream?: Socket<undefined>
  /** Client bytes not yet parsed into whole messages (or held while frozen). */
  inbox: Uint8Array
  /** Server bytes held while frozen. */
  held: Uint8Array[]
  /** Server bytes not yet parsed into whole messages. */
  fromServer: Uint8Array
  /** Unframed one-byte answers still due from the server (to SSLRequest / GSSENCRequest). */
  rawBytesDue: number
  /** Answers the client asked for so far (startup, Syncs, simple Queries): each ends with one ReadyForQuery. */
  answersAsked: number
  /** ReadyForQuery messages the server sent so far. */
  readySeen: number
  /** A trapped statement's answer, held ('hold-reply'). */
  reply?: Reply
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
  /** Ended by reset(): an upstream that connects afterwards is reset too. */
  wasReset: boolean
}

interface ArmedTrap {
  readonly rule: TrapRule
  readonly fire: (hit: TrapHit) => void
}

/** Only these messages execute a statement; a Parse may only describe it (postgres.js: Parse, Describe, Flush, and the Bind later). */
const executes = (type: number) => type === BIND || type === QUERY

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

  const send = sendQueued
  const flush = flushQueued

  const finish = (pair: Pair) => {
    if (pair.done) return
    pair.done = true
    pairs.delete(pair)
    if (!pair.clientClosed) pair.client.end()
    if (!pair.upstreamClosed) pair.upstream?.end()
  }

  /** SO_LINGER 0 on both sockets (Bun's terminate()): an RST each way, nothing held is delivered. */
  const resetPair = (pair: Pair) => {
    if (pair.done) return
    pair.done = true
    pair.wasReset = true
    pairs.delete(pair)
    pair.client.terminate()
    pair.upstream?.terminate()
  }

  const connectionOf = (pair: Pair): ProxyConnection => ({
    id: pair.id,
    startup: { ...pair.startup },
    get serverSidePort() { return pair.upstream?.localPort },
    get open() { return !pair.done },
    reset: () => resetPair(pair),
  })

  /** A closed side is passed on only while not frozen, nor while an answer is held: a partition hides closes too. */
  const propagateCloses = (pair: Pair) => {
    if (pair.frozen || pair.done || pair.reply?.state === 'holding') return
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
        pair.statements.set(name, text) // '' is the unnamed statement, replaced by the next unnamed Parse
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

  /** Fires the first armed trap this statement matches; 'hold' when the statement must not be forwarded. */
  const checkTraps = (pair: Pair, type: number, statement: string): 'hold' | 'pass' => {
    const trap = traps.find(({ rule }) =>
      rule.before.test(statement) && (rule.connection?.(pair.startup, connectionOf(pair)) ?? true) && ((rule.action ?? 'freeze') !== 'hold-reply' || executes(type)))
    if (!trap) return 'pass'
    traps = traps.filter((t) => t !== trap)
    const action = trap.rule.action ?? 'freeze'
    const hit = { startup: { ...pair.startup }, statement, at: Date.now(), connection: connectionOf(pair) }
    if (action === 'reset') {
      resetPair(pair)
      trap.fire(hit)
      return 'hold'
    }
    if (action === 'hold-reply') {
      let completed = () => {}
      const complete = new Promise<void>((resolve) => { completed = resolve })
      const reply: Reply = { after: pair.answersAsked, state: 'holding', messages: [], completed }
      pair.reply = reply
      trap.fire({ ...hit, reply: {
        complete,
        drop() {
          if (reply.state !== 'holding') return
          reply.state = 'dropping'
          for (const { bytes, ofReply } of reply.messages.splice(0)) if (!ofReply) pair.held.push(bytes)
          pumpToClient(pair)
          propagateCloses(pair)
        },
        deliver() {
          if (reply.state !== 'holding') return
          reply.state = 'delivered'
          for (const { bytes } of reply.messages.splice(0)) pair.held.push(bytes)
          pumpToClient(pair)
          propagateCloses(pair)
        },
      } })
      return 'pass'
    }
    if ((trap.rule.scope ?? 'connection') === 'all') freezeAll(trap.rule.newConnections ?? 'freeze')
    else freezePair(pair)
    trap.fire(hit)
    return 'hold'
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
        const code = view.getInt32(4)
        if (code === PROTOCOL_3) {
          pair.startedUp = true
          pair.answersAsked++
          const parts = decoder.decode(buffer.subarray(at + 8, at + length)).split('\u0000')
          for (let i = 0; i + 1 < parts.length && parts[i] !== ''; i += 2) pair.startup[parts[i]!] = parts[i + 1]!
        } else if (ENCRYPTION_REQUESTS.has(code)) {
          pair.rawBytesDue++
        }
        at += length
        continue
      }
      if (buffer.length - at < 5) break
      const type = buffer[at]!
      const length = new DataView(buffer.buffer, buffer.byteOffset + at + 1).getInt32(0)
      if (buffer.length - at < 1 + length) break
      const statement = statementOf(pair, type, buffer.subarray(at + 5, at + 1 + length))
      if (statement !== undefined && traps.length > 0 && checkTraps(pair, type, statement) === 'hold') break
      if (type === SYNC || type === QUERY) pair.answersAsked++
      at += 1 + length
    }
    if (pair.done) return // reset by a trap: nothing more goes anywhere
    send(pair.upstream, pair.toServer, buffer.subarray(0, at))
    pair.inbox = buffer.subarray(at)
  }

  /**
   * Splits the server's bytes into whole messages and counts its
   * ReadyForQuery messages; while an answer is held ('hold-reply'), captures
   * the messages from that answer on. The rest goes to the client (or waits
   * in `held` while frozen).
   */
  const receiveFromServer = (pair: Pair, chunk: Uint8Array) => {
    const buffer = concat(pair.fromServer, chunk)
    let at = 0
    for (;;) {
      if (pair.rawBytesDue > 0) {
        if (buffer.length - at < 1) break
        pair.held.push(buffer.subarray(at, at + 1))
        pair.rawBytesDue--
        at += 1
        continue
      }
      if (buffer.length - at < 5) break
      const length = new DataView(buffer.buffer, buffer.byteOffset + at + 1).getInt32(0)
      if (buffer.length - at < 1 + length) break
      const bytes = buffer.subarray(at, at + 1 + length)
      const reply = pair.reply
      const ofReply = reply !== undefined && pair.readySeen === reply.after
      const afterReply = reply !== undefined && pair.readySeen > reply.after
      if (bytes[0] === READY_FOR_QUERY) pair.readySeen++
      if (reply?.state === 'holding' && (ofReply || afterReply)) reply.messages.push({ bytes, ofReply })
      else if (!(reply?.state === 'dropping' && ofReply)) pair.held.push(bytes)
      if (ofReply && bytes[0] === READY_FOR_QUERY) reply!.completed()
      at += 1 + length
    }
    pair.fromServer = buffer.subarray(at)
    pumpToClient(pair)
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
          receiveFromServer(pair, new Uint8Array(chunk)) // a copy: Bun may reuse the buffer
        },
        drain(upstream) { flush(upstream, pair.toServer) },
        close() { pair.upstreamClosed = true; propagateCloses(pair) },
        error() { pair.upstreamClosed = true; propagateCloses(pair) },
      },
    }).then((upstream) => {
      pair.upstream = upstream
      if (pair.done) return void (pair.wasReset ? upstream.terminate() : upstream.end())
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
          fromServer: new Uint8Array(0), rawBytesDue: 0, answersAsked: 0, readySeen: 0,
          startedUp: false, startup: {}, statements: new Map(), connecting: false, clientClosed: false, upstreamClosed: false, done: false, wasReset: false,
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
    connections() {
      return [...pairs].map(connectionOf)
    },
    reset(filter = () => true) {
      const chosen = [...pairs].map((pair) => ({ pair, connection: connectionOf(pair) })).filter(({ connection }) => filter(connection))
      for (const { pair } of chosen) resetPair(pair)
      return chosen.map(({ connection }) => connection)
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
