import type { Socket, TCPSocketListener } from 'bun'
import { flushQueued, sendQueued } from '../test/support/socket-queue'

/**
 * A TCP proxy between the service and PostgreSQL that reads the wire protocol
 * and counts, for all connections together:
 * - `statements`: Sync ('S') and simple Query ('Q') messages, one per statement
 *   sent. A multi-row statement (`insert ... select from unnest($1, $2)`, one
 *   statement for a batch of claims) is one statement;
 * - `roundTrips`: statements sent while that connection had no answer
 *   outstanding, i.e. times a connection had to wait for the server before
 *   going on. Statements pipelined behind an unanswered one are not a new
 *   round trip (postgres.js pipelines queries queued on a busy connection, so
 *   under concurrency round trips fall below statements even without batching);
 * - `describes`: Flush ('H') messages, the extra Describe round trip postgres.js
 *   makes the first time a connection runs a statement (0 once warm);
 * - `transactions`: ReadyForQuery answers that leave the connection idle
 *   ('I'), i.e. transactions ended: each autocommit statement is one, a
 *   BEGIN ... COMMIT is one;
 * - `writingTransactions`: those in which a statement's text mentions INSERT,
 *   UPDATE or DELETE (a heuristic: a function that writes, called by SELECT
 *   alone, is missed), each one a WAL flush at commit;
 * - `commits`: explicit COMMIT statements;
 * - `byText`: the same statement and round-trip counts per statement text
 *   (whitespace collapsed), so any SQL the engine sends is seen without
 *   knowing it; `kind(text)` (given by the caller) sorts them into kinds.
 * Divide the change over N requests by N to get the per-request cost.
 */
export interface RoundTripCounter {
  readonly url: string
  snapshot(): Counts
  stop(): void
}

export interface TextCounts {
  statements: number
  roundTrips: number
}

export interface Counts {
  statements: number
  roundTrips: number
  describes: number
  transactions: number
  writingTransactions: number
  commits: number
  /** Per statement text. */
  byText: Record<string, TextCounts>
}

const SYNC = 0x53 // 'S'
const QUERY = 0x51 // 'Q'
const FLUSH = 0x48 // 'H'
const PARSE = 0x50 // 'P'
const BIND = 0x42 // 'B'
const READY_FOR_QUERY = 0x5a // 'Z'
const IDLE = 0x49 // 'I': ReadyForQuery's status outside a transaction

/** Messages whose body we read; all others are skipped unread. */
const CLIENT_BODIES = new Set([PARSE, BIND, QUERY])
const SERVER_BODIES = new Set([READY_FOR_QUERY])

const WRITES = /\b(insert|update|delete|merge)\b/i
const COMMIT = /^\s*(commit|end)\b/i

/**
 * Walks a stream of protocol messages (type byte + Int32 length incl. itself),
 * calling `onMessage` per message, with its body for the types in `bodies`
 * (gathered across chunks), else an empty one.
 */
class MessageScanner {
  private header = new Uint8Array(5)
  private filled = 0
  private skip = 0
  private type = 0
  private body: Uint8Array | undefined
  private bodyFilled = 0

  /** `untypedFirst`: the client's first message (StartupMessage) has a length but no type byte. */
  constructor(private untypedFirst: boolean, private readonly bodies: ReadonlySet<number>, private readonly onMessage: (type: number, body: Uint8Array) => void) {}

  feed(chunk: Uint8Array): void {
    let i = 0
    while (i < chunk.length) {
      if (this.body) {
        const n = Math.min(this.body.length - this.bodyFilled, chunk.length - i)
        this.body.set(chunk.subarray(i, i + n), this.bodyFilled)
        this.bodyFilled += n
        i += n
        if (this.bodyFilled === this.body.length) {
          const body = this.body
          this.body = undefined
          this.onMessage(this.type, body)
        }
        continue
      }
      if (this.skip > 0) {
        const n = Math.min(this.skip, chunk.length - i)
        this.skip -= n
        i += n
        continue
      }
      const headerSize = this.untypedFirst ? 4 : 5
      while (this.filled < headerSize && i < chunk.length) this.header[this.filled++] = chunk[i++]!
      if (this.filled < headerSize) return
      const offset = this.untypedFirst ? 0 : 1
      const length = new DataView(this.header.buffer).getInt32(offset)
      const untyped = this.untypedFirst
      this.filled = 0
      this.untypedFirst = false
      if (untyped) {
        this.skip = length - 4
        continue
      }
      this.type = this.header[0]!
      if (this.bodies.has(this.type) && length > 4) {
        this.body = new Uint8Array(length - 4)
        this.bodyFilled = 0
      } else {
        this.skip = length - 4
        this.onMessage(this.type, new Uint8Array(0))
      }
    }
  }
}

const decoder = new TextDecoder()

/** The NUL-terminated strings at the start of a message body. */
function cStrings(body: Uint8Array, count: number): string[] {
  const out: string[] = []
  let start = 0
  for (let k = 0; k < count; k++) {
    const end = body.indexOf(0, start)
    if (end < 0) break
    out.push(decoder.decode(body.subarray(start, end)))
    start = end + 1
  }
  return out
}

const collapse = (text: string) => text.replace(/\s+/g, ' ').trim()

export function emptyCounts(): Counts {
  return { statements: 0, roundTrips: 0, describes: 0, transactions: 0, writingTransactions: 0, commits: 0, byText: {} }
}

/** after − before, per field and per text. */
export function difference(after: Counts, before: Counts): Counts {
  const byText: Record<string, TextCounts> = {}
  for (const [text, counts] of Object.entries(after.byText)) {
    const was = before.byText[text] ?? { statements: 0, roundTrips: 0 }
    const statements = counts.statements - was.statements
    const roundTrips = counts.roundTrips - was.roundTrips
    if (statements > 0 || roundTrips > 0) byText[text] = { statements, roundTrips }
  }
  return {
    statements: after.statements - before.statements,
    roundTrips: after.roundTrips - before.roundTrips,
    describes: after.describes - before.describes,
    transactions: after.transactions - before.transactions,
    writingTransactions: after.writingTransactions - before.writingTransactions,
    commits: after.commits - before.commits,
    byText,
  }
}

export async function startRoundTripCounter(target: string): Promise<RoundTripCounter> {
  const { hostname, port } = new URL(target)
  const counts = emptyCounts()

  interface Link {
    upstream?: Socket<undefined>
    /** Bytes not yet taken by each side's socket (backpressure), in order. */
    toServer: Uint8Array[]
    toClient: Uint8Array[]
    /** Whether the startup exchange's ReadyForQuery came. */
    startedUp: boolean
    /** Statements sent on this connection and not yet answered with ReadyForQuery. */
    outstanding: number
    /** For each of them, in order: whether its text writes. */
    writes: boolean[]
    /** Prepared statements of this connection by name ('' is the unnamed one): their text. */
    prepared: Map<string, string>
    /** Texts of the statement being sent (Bind/Query since the last Sync). */
    current: string[]
    /** Whether the open transaction wrote (a statement of it answered so far). */
    wrote: boolean
    fromClient: MessageScanner
    fromServer: MessageScanner
  }

  function statementSent(link: Link, texts: readonly string[]) {
    const text = texts.length === 0 ? '(empty)' : texts.join('; ')
    counts.statements += 1
    const entry = (counts.byText[text] ??= { statements: 0, roundTrips: 0 })
    entry.statements += 1
    if (link.outstanding === 0) {
      counts.roundTrips += 1
      entry.roundTrips += 1
    }
    link.outstanding += 1
    link.writes.push(WRITES.test(text))
    if (COMMIT.test(text)) counts.commits += 1
  }

  const send = sendQueued
  const flush = flushQueued

  const listener: TCPSocketListener<Link> = Bun.listen<Link>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(client) {
        const link: Link = {
          toServer: [],
          toClient: [],
          startedUp: false,
          outstanding: 0,
          writes: [],
          prepared: new Map(),
          current: [],
          wrote: false,
          fromClient: new MessageScanner(true, CLIENT_BODIES, (type, body) => {
            if (type === FLUSH) counts.describes += 1
            else if (type === PARSE) {
              const [name = '', text = ''] = cStrings(body, 2)
              link.prepared.set(name, collapse(text))
            } else if (type === BIND) {
              const [, statement = ''] = cStrings(body, 2)
              link.current.push(link.prepared.get(statement) ?? '(unknown prepared statement)')
            } else if (type === QUERY) {
              statementSent(link, [collapse(cStrings(body, 1)[0] ?? '')])
            } else if (type === SYNC) {
              statementSent(link, link.current.splice(0))
            }
          }),
          fromServer: new MessageScanner(false, SERVER_BODIES, (type, body) => {
            if (type !== READY_FOR_QUERY) return
            // The startup exchange ends with one ReadyForQuery: not a statement's answer.
            if (!link.startedUp) {
              link.startedUp = true
              return
            }
            link.outstanding = Math.max(0, link.outstanding - 1)
            if (link.writes.shift()) link.wrote = true
            if (body[0] === IDLE) {
              counts.transactions += 1
              if (link.wrote) counts.writingTransactions += 1
              link.wrote = false
            }
          }),
        }
        client.data = link
        void Bun.connect<undefined>({
          hostname,
          port: Number(port),
          socket: {
            data(_upstream, chunk) {
              link.fromServer.feed(chunk)
              send(client, link.toClient, chunk)
            },
            drain: (upstream) => flush(upstream, link.toServer),
            close: () => void client.end(),
            error: () => void client.end(),
          },
        }).then((upstream) => {
          link.upstream = upstream
          flush(upstream, link.toServer)
        }, () => client.end())
      },
      data(client, chunk) {
        const link = client.data
        link.fromClient.feed(chunk)
        send(link.upstream, link.toServer, chunk)
      },
      drain: (client) => flush(client, client.data.toClient),
      close: (client) => void client.data.upstream?.end(),
      error: (client) => void client.data.upstream?.end(),
    },
  })
  const proxied = new URL(target)
  proxied.hostname = '127.0.0.1'
  proxied.port = String(listener.port)
  return {
    url: proxied.toString(),
    snapshot: () => ({ ...counts, byText: Object.fromEntries(Object.entries(counts.byText).map(([text, c]) => [text, { ...c }])) }),
    stop: () => listener.stop(true),
  }
}
