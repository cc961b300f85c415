/**
 * PostgreSQL's text form of a timestamptz (`2026-12-01 00:50:46.069123+00`),
 * as keyset cursors carry it (exact to the microsecond, which a JS Date is
 * not). A cursor is client-held, so it may come back changed: a shape check
 * alone lets `2026-13-45 25:61:00+00` through, which PostgreSQL refuses with
 * an error (22008) that became a 500. This checks what PostgreSQL would: the
 * calendar, the clock and the offset.
 */
const TIMESTAMP = /^(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(\.\d{1,6})?([+-])(\d\d)(?::(\d\d))?$/

export function isTimestampText(text: string): boolean {
  const match = TIMESTAMP.exec(text)
  if (!match) return false
  const [year, month, day, hour, minute, second, , , offsetHours, offsetMinutes = '00'] = match.slice(1).map((part) => part ?? '') as string[]
  const y = Number(year)
  const m = Number(month)
  const d = Number(day)
  // Year 0 does not exist in PostgreSQL's AD calendar; days by month, leap years included.
  if (y < 1 || m < 1 || m > 12 || d < 1 || d > daysIn(y, m)) return false
  if (Number(hour) > 23 || Number(minute) > 59 || Number(second) > 59) return false
  // PostgreSQL takes offsets up to ±15:59.
  return Number(offsetHours) <= 15 && Number(offsetMinutes) <= 59
}

function daysIn(year: number, month: number): number {
  if (month === 2) return (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0 ? 29 : 28
  return [4, 6, 9, 11].includes(month) ? 30 : 31
}
