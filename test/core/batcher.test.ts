/**
 * The batcher's lanes (core/batcher.ts): a statement runs alone while it is
 * healthy, so everything queued behind it goes out together (bigger batches,
 * less PostgreSQL per request); one that runs past overlapAfterMs no longer
 * holds the queue: the next goes beside it, up to maxInFlight.
 */
import { expect, test } from 'bun:test'
import { Batcher } from '../../src/core/batcher'
import { waitFor } from '../support/wait'

/** A run whose statements the test ends by hand, in any order. */
function manual() {
  const statements: { inputs: number[]; end: () => void; sentAt: number }[] = []
  let inFlight = 0
  let most = 0
  const run = (inputs: readonly number[]) => new Promise<number[]>((resolve) => {
    inFlight++
    most = Math.max(most, inFlight)
    statements.push({ inputs: [...inputs], sentAt: performance.now(), end: () => { inFlight--; resolve(inputs.map((x) => x * 10)) } })
  })
  return { run, statements, most: () => most }
}

test('while a statement runs, the requests behind it wait and then go out as one statement, each with its own answer', async () => {
  const lanes = manual()
  const batcher = new Batcher<number, number>({ run: lanes.run, overlapAfterMs: 10_000 })
  const first = batcher.submit(0)
  const rest = Array.from({ length: 9 }, (_, i) => batcher.submit(i + 1))
  await Bun.sleep(20)
  expect(lanes.statements.map((s) => s.inputs)).toEqual([[0]])
  lanes.statements[0]!.end()
  expect(await first).toBe(0)
  await waitFor(() => lanes.statements.length === 2, 'the queued requests to go out')
  expect(lanes.statements.map((s) => s.inputs)).toEqual([[0], [1, 2, 3, 4, 5, 6, 7, 8, 9]])
  lanes.statements[1]!.end()
  expect(await Promise.all(rest)).toEqual([10, 20, 30, 40, 50, 60, 70, 80, 90])
  expect(lanes.most()).toBe(1)
  expect(batcher.stats).toEqual({ statements: 2, members: 10, largest: 9 })
})

test('a statement still running after overlapAfterMs no longer holds the queue: the next goes beside it, never more than maxInFlight', async () => {
  const lanes = manual()
  const batcher = new Batcher<number, number>({ run: lanes.run, overlapAfterMs: 40, maxInFlight: 2 })
  const stuck = batcher.submit(1) // its connection froze: it never returns until the test says so
  const queued = batcher.submit(2)
  await Bun.sleep(15)
  expect(lanes.statements).toHaveLength(1) // a young statement is waited for
  await waitFor(() => lanes.statements.length === 2, 'the queued request to go beside the stuck one')
  expect(lanes.statements.map((s) => s.inputs)).toEqual([[1], [2]])
  const gap = lanes.statements[1]!.sentAt - lanes.statements[0]!.sentAt
  expect(gap).toBeGreaterThanOrEqual(39)
  lanes.statements[1]!.end()
  expect(await queued).toBe(20)

  // Both lanes taken (the second stuck too): a third waits, however long they run.
  const second = batcher.submit(3)
  await Bun.sleep(60)
  const third = batcher.submit(4)
  await Bun.sleep(100)
  expect(lanes.statements.map((s) => s.inputs)).toEqual([[1], [2], [3]])
  lanes.statements[0]!.end()
  expect(await stuck).toBe(10)
  await waitFor(() => lanes.statements.length === 4, 'the third to go out once a lane is free')
  expect(lanes.statements.map((s) => s.inputs)).toEqual([[1], [2], [3], [4]])
  lanes.statements[2]!.end()
  lanes.statements[3]!.end()
  expect(await Promise.all([second, third])).toEqual([30, 40])
  expect(lanes.most()).toBe(2)
})

// Catches: a burst that waits whole behind a young statement (the lane's overlapAtDepth ignored), or one that
// goes out past maxInFlight.
test('a statement\'s worth of members queued behind a young statement goes beside it at once, never more than maxInFlight', async () => {
  const lanes = manual()
  const batcher = new Batcher<number, number>({ run: lanes.run, overlapAfterMs: 60_000, overlapAtDepth: 3, maxInFlight: 2 })
  const first = batcher.submit(0)
  const early = [batcher.submit(1), batcher.submit(2)]
  expect(lanes.statements.map((s) => s.inputs)).toEqual([[0]]) // two waiting: fewer than a statement's worth
  const third = batcher.submit(3)
  expect(lanes.statements.map((s) => s.inputs)).toEqual([[0], [1, 2, 3]])
  // Both lanes taken: a second burst waits for one of them, however deep.
  const burst = [4, 5, 6, 7].map((n) => batcher.submit(n))
  expect(lanes.statements).toHaveLength(2)
  lanes.statements[1]!.end()
  expect(await Promise.all([...early, third])).toEqual([10, 20, 30])
  await waitFor(() => lanes.statements.length === 3, 'the burst to go out once a lane is free')
  expect(lanes.statements[2]!.inputs).toEqual([4, 5, 6, 7])
  lanes.statements[0]!.end()
  lanes.statements[2]!.end()
  expect(await first).toBe(0)
  expect(await Promise.all(burst)).toEqual([40, 50, 60, 70])
  expect(lanes.most()).toBe(2)
})

// Catches: a batcher called idle while a member waits or a statement runs (the Citus lane would drop it, core/lane.ts).
test('idle only with nothing queued and nothing in flight', async () => {
  let release = () => {}
  const batcher = new Batcher<number, number>({ run: (inputs) => new Promise((resolve) => { release = () => resolve(inputs) }), maxInFlight: 1 })
  expect(batcher.idle).toBe(true)
  const first = batcher.submit(1)
  expect(batcher.idle).toBe(false)
  const second = batcher.submit(2)
  release()
  expect(await first).toBe(1)
  expect(batcher.idle).toBe(false)
  await waitFor(() => batcher.stats.statements === 2, 'the second statement')
  release()
  expect(await second).toBe(2)
  await waitFor(() => batcher.idle, 'the batcher idle once its last statement ended')
})
