/**
 * The exact value, one click away, wherever a client-chosen string is shown
 * with escapes (characters.ts visibleText): JSON with every character outside
 * printable ASCII as `\uXXXX`, the form the log lines use, so an operator can
 * tell `cus_A\u200bC` from what a client typed, and grep the logs for it.
 * Nothing when what is shown is the value itself.
 */
import { exactText, visibleText } from '../../characters'

export function Exact({ value }: { value: string | Readonly<Record<string, unknown>> }): JSX.Element {
  const strings = typeof value === 'string' ? [value] : Object.values(value).filter((field): field is string => typeof field === 'string')
  if (strings.every((text) => visibleText(text) === text)) return ''
  return <details class="exact"><summary>exact</summary><code safe>{exactText(value)}</code></details>
}
