/**
 * Batching at the seam, never with a timer (river's InsertMany,
 * graphile-worker's add_jobs, PostgreSQL's own group commit): while a
 * statement is running, new requests queue; as it returns, everything queued
 * goes out as one statement, and each caller gets its own row of the answer.
 * At low load nothing waits (a request finds no statement running and goes
 * alone); under load one round trip, one parse and one WAL flush serve many
 * requests. A statement that runs long (a connection that froze under it, a
 * lock wait) does not hold the queue back: past `overlapAfterMs` the next
 * one goes beside it, up to `maxInFlight`; so does a statement's worth of
 * members queued behind it (`overlapAtDepth`: a burst).
 *
 * A member's failure fails that member only: the statement answers per
 * member (a lost lease is a row that is missing, not an error). A statement
 * that fails for a reason of one member (`isolate`: a CHECK, a unique
 * violation, a row locked by another session) is run again member by member,
 * so only the member at fault gets the error; one that fails for its
 * connection fails every member it carried, each of which then knows its own
 * lease (released or left reclaimable by its caller).
 */
export interface BatcherOptions<Input, Output> {
  /** Runs one statement for `inputs`: one output per input, in order. */
  readonly run: (inputs: readonly Input[]) => Promise<readonly Output[]>
  /**
   * Statements in flight at once, at most. @default 2: a second lane for
   * when the first is stuck.
   */
  readonly maxInFlight?: number
  /**
   * Milliseconds a statement runs alone before the next may go beside it.
   * Measured at 32 concurrent fresh payments (BENCHMARKS.md, issue 25): two
   * statements always in flight made 4.5 members per statement and cost
   * PostgreSQL 265 µs per payment; one at a time made 7.2 and 195 µs, and
   * 13 % more payments per second. A healthy batch returns within a few
   * milliseconds even on a busy machine; one still running after this is
   * waiting on something, and the queue goes on without it. @default 20
   */
  readonly overlapAfterMs?: number
  /**
   * Members queued behind a running statement that go out beside it at once,
   * within maxInFlight, however young it is: a statement's worth is already
   * waiting, so waiting on for the running one would add what is left of its
   * time to each of theirs without making their statement cheaper per member.
   * @default never (only overlapAfterMs)
   */
  readonly overlapAtDepth?: number
  /** Members per statement, so one statement stays short (its row locks, its plan). @default 128 */
  readonly maxBatch?: number
  /** Whether a failed batch should be retried member by member (one member's data or lock, not its connection). @default never */
  readonly isolate?: (error: unknown) => boolean
  /**
   * A member's kind, when a batch may carry several (lane.ts: claims and
   * completions). A statement sent beside others (past overlapAfterMs)
   * carries one kind only, that of its oldest member, so a statement stuck
   * on one kind's work (a completion waiting on a lock) never takes the
   * other kind down with it. @default one kind
   */
  readonly kindOf?: (input: Input) => string
}

interface Pending<Input, Output> {
  readonly input: Input
  readonly resolve: (output: Output) => void
  readonly reject: (error: unknown) => void
  readonly signal: AbortSignal | undefined
  readonly onAbort: (() => void) | undefined
}

export interface BatcherStats {
  /** Statements sent. */
  readonly statements: number
  /** Members carried by them. */
  readonly members: number
  /** The largest batch. */
  readonly largest: number
}

export class Batcher<Input, Output> {
  readonly #run: (inputs: readonly Input[]) => Promise<readonly Output[]>
  readonly #maxInFlight: number
  readonly #maxBatch: number
  readonly #overlapAfterMs: number
  readonly #overlapAtDepth: number
  readonly #isolate: (error: unknown) => boolean
  readonly #kindOf: ((input: Input) => string) | undefined
  #queue: Pending<Input, Output>[] = []
  #inFlight = 0
  /** When the youngest statement in flight was sent (performance.now()). */
  #youngestSentAt = 0
  #overlapTimer: ReturnType<typeof setTimeout> | undefined
  #stats = { statements: 0, members: 0, largest: 0 }

  constructor(options: BatcherOptions<Input, Output>) {
    this.#run = options.run
    this.#maxInFlight = options.maxInFlight ?? 2
    this.#maxBatch = options.maxBatch ?? 128
    this.#overlapAfterMs = options.overlapAfterMs ?? 20
    this.#overlapAtDepth = options.overlapAtDepth ?? Number.POSITIVE_INFINITY
    this.#isolate = options.isolate ?? (() => false)
    this.#kindOf = options.kindOf
  }

  get stats(): BatcherStats {
    return { ...this.#stats }
  }

  /** Nothing queued and nothing in flight: dropping this batcher loses nothing. */
  get idle(): boolean {
    return this.#queue.length === 0 && this.#inFlight === 0
  }

  /**
   * One member's result. `signal`: while still queued, an abort takes the
   * member out (it is never sent); once sent, the statement goes on and its
   * result is the caller's to handle (it may have committed).
   */
  submit(input: Input, signal?: AbortSignal): Promise<Output> {
    if (signal?.aborted) return Promise.reject(signal.reason)
    return new Promise<Output>((resolve, reject) => {
      let pending: Pending<Input, Output>
      const onAbort = signal ? () => {
        const at = this.#queue.indexOf(pending)
        if (at < 0) return // already sent
        this.#queue.splice(at, 1)
        reject(signal.reason)
      } : undefined
      pending = { input, resolve, reject, signal, onAbort }
      signal?.addEventListener('abort', onAbort!, { once: true })
      this.#queue.push(pending)
      this.#pump()
    })
  }

  /**
   * One member in a statement of its own, sent at once beside whatever is in
   * flight, never batched and not counted against maxInFlight: a member whose
   * row was found locked waits there alone (lane.ts), holding no one else's
   * statement and no place in the queue.
   */
  submitAlone(input: Input): Promise<Output> {
    return new Promise<Output>((resolve, reject) => {
      void this.#send([{ input, resolve, reject, signal: undefined, onAbort: undefined }])
    })
  }

  #pump(): void {
    while (this.#queue.length > 0 && this.#maySend()) {
      const batch = this.#inFlight > 0 && this.#kindOf ? this.#takeOldestKind(this.#kindOf) : this.#queue.splice(0, this.#maxBatch)
      for (const member of batch) member.signal?.removeEventListener('abort', member.onAbort!)
      this.#inFlight++
      this.#youngestSentAt = performance.now()
      void this.#send(batch).finally(() => {
        this.#inFlight--
        this.#pump()
      })
    }
    this.#armOverlap()
  }

  /** Up to maxBatch queued members of the oldest member's kind; the others keep their places. */
  #takeOldestKind(kindOf: (input: Input) => string): Pending<Input, Output>[] {
    const kind = kindOf(this.#queue[0]!.input)
    const taken: Pending<Input, Output>[] = []
    const left: Pending<Input, Output>[] = []
    for (const member of this.#queue) (taken.length < this.#maxBatch && kindOf(member.input) === kind ? taken : left).push(member)
    this.#queue = left
    return taken
  }

  /** Alone; or within maxInFlight, beside statements that have all run past overlapAfterMs, or with overlapAtDepth members waiting. */
  #maySend(): boolean {
    if (this.#inFlight === 0) return true
    if (this.#inFlight >= this.#maxInFlight) return false
    return this.#queue.length >= this.#overlapAtDepth || performance.now() - this.#youngestSentAt >= this.#overlapAfterMs
  }

  /** Members wait behind a running statement: look again when it has run overlapAfterMs. */
  #armOverlap(): void {
    if (this.#overlapTimer !== undefined || this.#queue.length === 0 || this.#inFlight === 0 || this.#inFlight >= this.#maxInFlight) return
    const wait = Math.max(0, this.#youngestSentAt + this.#overlapAfterMs - performance.now())
    this.#overlapTimer = setTimeout(() => {
      this.#overlapTimer = undefined
      this.#pump()
    }, wait)
    this.#overlapTimer.unref?.()
  }

  async #send(batch: readonly Pending<Input, Output>[]): Promise<void> {
    this.#stats.statements++
    this.#stats.members += batch.length
    this.#stats.largest = Math.max(this.#stats.largest, batch.length)
    try {
      const outputs = await this.#run(batch.map((member) => member.input))
      batch.forEach((member, i) => member.resolve(outputs[i]!))
    } catch (error) {
      if (batch.length > 1 && this.#isolate(error)) {
        // Each member alone, at once (not queued behind others): only the one at fault fails.
        await Promise.all(batch.map((member) => this.#send([member])))
        return
      }
      for (const member of batch) member.reject(error)
    }
  }
}
