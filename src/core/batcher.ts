/**
 * Batching at the seam, never with a timer (river's InsertMany,
 * graphile-worker's add_jobs, PostgreSQL's own group commit): while
 * `maxInFlight` statements are running, new requests queue; as one returns,
 * everything queued goes out as one statement, and each caller gets its own
 * row of the answer. At low load nothing waits (a request finds a free slot
 * and goes alone); under load one round trip, one parse and one WAL flush
 * serve many requests.
 *
 * A member's failure fails that member only: the statement answers per
 * member (a lost lease is a row that is missing, not an error). A statement
 * that fails for a reason of its data (a CHECK, a unique violation) is run
 * again member by member, so only the member at fault gets the error; one
 * that fails for its connection fails every member it carried, each of which
 * then knows its own lease (released or left reclaimable by its caller).
 */
export interface BatcherOptions<Input, Output> {
  /** Runs one statement for `inputs`: one output per input, in order. */
  readonly run: (inputs: readonly Input[]) => Promise<readonly Output[]>
  /**
   * Statements in flight at once. 2: one runs while the next fills, so a
   * request never waits for more than the statement ahead of it; at 32
   * concurrent fresh requests that made 5 claims per statement
   * (BENCHMARKS.md). Other values were not measured.
   */
  readonly maxInFlight?: number
  /** Members per statement, so one statement stays short (its row locks, its plan). @default 128 */
  readonly maxBatch?: number
  /** Whether a failed batch should be retried member by member (its own data, not its connection). @default never */
  readonly isolate?: (error: unknown) => boolean
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
  readonly #isolate: (error: unknown) => boolean
  #queue: Pending<Input, Output>[] = []
  #inFlight = 0
  #stats = { statements: 0, members: 0, largest: 0 }

  constructor(options: BatcherOptions<Input, Output>) {
    this.#run = options.run
    this.#maxInFlight = options.maxInFlight ?? 2
    this.#maxBatch = options.maxBatch ?? 128
    this.#isolate = options.isolate ?? (() => false)
  }

  get stats(): BatcherStats {
    return { ...this.#stats }
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

  #pump(): void {
    while (this.#inFlight < this.#maxInFlight && this.#queue.length > 0) {
      const batch = this.#queue.splice(0, this.#maxBatch)
      for (const member of batch) member.signal?.removeEventListener('abort', member.onAbort!)
      this.#inFlight++
      void this.#send(batch).finally(() => {
        this.#inFlight--
        this.#pump()
      })
    }
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
