/** Ids and leases as operators type them: positive bigints in decimal, checked to PostgreSQL's range before any statement. */

const BIGINT_MAX = 9_223_372_036_854_775_807n

/** `1` to `9223372036854775807`, no sign, no leading zero: `9999999999999999999` passes a 19-digit pattern and failed in PostgreSQL. */
export function isPositiveBigint(text: string): boolean {
  return /^[1-9]\d{0,18}$/.test(text) && BigInt(text) <= BIGINT_MAX
}
