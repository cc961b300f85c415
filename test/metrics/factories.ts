/**
 * Reading Prometheus expositions in tests. (Keys in any state come from the
 * one key factory, test/support/keys.ts.)
 */

/** The value of one sample in a Prometheus text exposition, or undefined. */
export function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$/.exec(line)
    if (!match || match[1] !== name) continue
    const present = Object.fromEntries([...(match[3] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((m) => [m[1], m[2]]))
    if (Object.entries(labels).every(([k, v]) => present[k] === v) && Object.keys(present).length === Object.keys(labels).length)
      return Number(match[4])
  }
  return undefined
}
