/**
 * A PostgreSQL array literal of text values, to bind as one text parameter
 * and cast in SQL (`${pgTextArray(xs)}::text[]`, or `::bigint[]`).
 *
 * Why not postgres.js's own arrays: they need the type query it runs on every
 * new connection (`fetch_types`), which we turn off (store/db.ts says why),
 * and without it a JS array is sent as `a,b,c`. Every element is quoted, so
 * no value can end the literal early or smuggle another element.
 */
export function pgTextArray(values: readonly (string | null)[]): string {
  return `{${values.map((value) => (value === null ? 'NULL' : `"${value.replace(/[\\"]/g, (char) => `\\${char}`)}"`)).join(',')}}`
}
