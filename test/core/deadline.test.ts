/**
 * untilAborted: the deadline holds whatever the work does, and the work's
 * late failure is nobody's unhandled rejection (invariant 9: the plugin's
 * `act` and the provider client both run under it).
 */
import { expect, test } from 'bun:test'
import { DeadlineExceededError, untilAborted } from '../../src/core/deadline'
import { nextTurn } from '../support/wait'

const unhandled: unknown[] = []
process.on('unhandledRejection', (reason) => { unhandled.push(reason) })

// Catches: a work promise left without a handler when the signal had already fired (its later
// rejection reached the process as unhandled), or a deadline that waits for the work.
test('with the signal already fired: rejects at once with its reason, and the work\'s late failure is handled', async () => {
  const controller = new AbortController()
  controller.abort(new DeadlineExceededError(5))
  let fail: (error: Error) => void = () => undefined
  const work = new Promise<string>((_, reject) => { fail = reject })
  await expect(untilAborted(work, controller.signal)).rejects.toBeInstanceOf(DeadlineExceededError)
  fail(new Error('late failure'))
  await nextTurn() // where the runtime reports a rejection nobody handled
  expect(unhandled).toEqual([])
})

test('fired while the work runs: rejects with the reason then; the work\'s late failure is handled', async () => {
  const controller = new AbortController()
  let fail: (error: Error) => void = () => undefined
  const work = new Promise<string>((_, reject) => { fail = reject })
  const racing = untilAborted(work, controller.signal)
  controller.abort(new DeadlineExceededError(5))
  await expect(racing).rejects.toBeInstanceOf(DeadlineExceededError)
  fail(new Error('late failure'))
  await nextTurn() // where the runtime reports a rejection nobody handled
  expect(unhandled).toEqual([])
  expect(await untilAborted(Promise.resolve('done'), new AbortController().signal)).toBe('done')
})
