/**
 * Tests wait on signals, not time: `waitFor` polls a condition and fails
 * naming what it waited for. The poll interval only bounds how late the test
 * notices; nothing depends on it.
 */
const POLL_MS = 10

export async function waitFor(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await condition()) return
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await Bun.sleep(POLL_MS)
  }
}
