/**
 * The payment provider simulator: a small HTTP server with a real provider's
 * idempotency semantics and its failure modes, applied over real HTTP.
 *
 * Built on node:http rather than Bun.serve on purpose: a lost answer must be
 * a TCP connection closed with no HTTP response at all, and Bun.serve has no
 * documented way to do that (a thrown handler becomes a 500). Bun implements
 * node:http natively; `socket.destroy()` closes the connection with zero bytes
 * written, and a fetch client then rejects (ECONNRESET), as after a real loss.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { IDEMPOTENCY_KEY, parseChargeRequest, type Charge } from './charge'
import { openLedger } from './ledger'

export interface SimulatorOptions {
  /** @default '127.0.0.1' */
  readonly hostname?: string
  /** 0 picks any free port. */
  readonly port: number
  /** SQLite file of the ledger; its folder is created. */
  readonly ledgerPath: string
  /** Latency of every charge; a huge value simulates a provider that hangs. */
  readonly delayMs: number
  /** Share (0..1) of charges refused with 503 before anything is charged. */
  readonly failureRate: number
  /** Share (0..1) of charges made and recorded whose answer is lost (connection dropped). */
  readonly lostResponseRate: number
  /**
   * Injectable for tests, in [0, 1). Every charge request that passes
   * validation draws once for the failure roll after its delay, and once more
   * for the loss roll if it got a charge (new or replayed), in that order.
   * @default Math.random
   */
  readonly random?: () => number
}

export interface Simulator {
  /** Base URL, e.g. http://127.0.0.1:3001 */
  readonly url: string
  readonly port: number
  /** What the ledger holds, oldest first: for tests. */
  charges(customer?: string): Charge[]
  /** Valid charge requests not yet answered (most are waiting out the delay): tests wait on it instead of sleeping. */
  pendingCharges(): number
  /** Stops listening, drops open connections, abandons delayed charges (uncharged), closes the ledger. */
  stop(): Promise<void>
}

/** 16 KiB: a charge request is under 200 bytes; the cap keeps a broken client from filling memory. */
const MAX_BODY_BYTES = 16_384
/** setTimeout's largest delay (about 24.8 days); a longer one would fire at once. Longer is "hung" anyway. */
const MAX_TIMER_MS = 2 ** 31 - 1

export async function startSimulator(options: SimulatorOptions): Promise<Simulator> {
  const random = options.random ?? Math.random
  const ledger = openLedger(options.ledgerPath)
  // Aborted by stop(), so charges waiting out their delay end instead of writing to a closed ledger.
  const stopping = new AbortController()
  let pending = 0

  async function postCharge(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const key = req.headers['idempotency-key']
    if (typeof key !== 'string' || !IDEMPOTENCY_KEY.test(key))
      return reply(res, 400, { error: 'Idempotency-Key header must be 1 to 255 printable ASCII characters' })
    const body = await readJson(req)
    if (body === TOO_LARGE) return reply(res, 413, { error: 'body too large' })
    const request = parseChargeRequest(body)
    if (typeof request === 'string') return reply(res, 400, { error: request })

    // A real provider keeps processing when its caller gives up, so the wait ignores the client.
    pending++
    try {
      await sleep(Math.min(options.delayMs, MAX_TIMER_MS), stopping.signal)
    } finally {
      pending--
    }
    if (stopping.signal.aborted) return void res.destroy()
    if (random() < options.failureRate) return reply(res, 503, { error: 'provider unavailable (simulated)' })
    const result = ledger.record(key, request)
    if (result.kind === 'mismatch')
      return reply(res, 422, { error: 'this Idempotency-Key was used with other parameters' })
    // Dropped after recording: the charge stands, only its answer is gone.
    if (random() < options.lostResponseRate) return void res.destroy()
    reply(res, 200, result.charge)
  }

  function getCharges(url: URL, res: ServerResponse): void {
    const customer = url.searchParams.get('customer') ?? undefined
    reply(res, 200, { data: ledger.list(customer) })
  }

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://simulator')
    const route = `${req.method} ${url.pathname}`
    const handled =
      route === 'POST /v1/charges' ? postCharge(req, res)
      : route === 'GET /v1/charges' ? getCharges(url, res)
      : route === 'GET /healthz' ? reply(res, 200, { status: 'ok' })
      : url.pathname === '/v1/charges' || url.pathname === '/healthz' ? reply(res, 405, { error: 'method not allowed' })
      : reply(res, 404, { error: 'not found' })
    Promise.resolve(handled).catch((error: unknown) => {
      console.error('provider simulator: request failed:', error)
      if (!res.headersSent && !res.destroyed) reply(res, 500, { error: 'internal error' })
    })
  })

  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject)
      server.listen(options.port, options.hostname ?? '127.0.0.1', () => {
        server.off('error', reject)
        resolve()
      })
    })
  } catch (error) {
    // EADDRINUSE and the like: leave no open ledger behind for an in-process caller.
    ledger.close()
    throw error
  }
  const { port, address } = server.address() as AddressInfo
  const host = address.includes(':') ? `[${address}]` : address

  let stopped: Promise<void> | undefined
  return {
    url: `http://${host}:${port}`,
    port,
    charges: (customer) => ledger.list(customer),
    pendingCharges: () => pending,
    stop: () => (stopped ??= (async () => {
      stopping.abort()
      const closed = new Promise<void>((resolve) => server.close(() => resolve()))
      server.closeAllConnections()
      await closed
      // Every handler past its delay ran to completion synchronously, so nothing writes after this.
      ledger.close()
    })()),
  }
}

const TOO_LARGE = Symbol('too large')

/** The body as JSON; undefined when it is not JSON, TOO_LARGE past the cap. */
async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length
    if (size > MAX_BODY_BYTES) return TOO_LARGE
    chunks.push(chunk)
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8'))
  } catch {
    return undefined
  }
}

function reply(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) })
  res.end(text)
}

/** Resolves after `ms`, or at once when `signal` aborts (the caller checks which). */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  if (ms <= 0 || signal.aborted) return Promise.resolve()
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer)
      signal.removeEventListener('abort', done)
      resolve()
    }
    const timer = setTimeout(done, ms)
    signal.addEventListener('abort', done, { once: true })
  })
}
