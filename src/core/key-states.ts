/**
 * A new-form answer's headers as stored (JSON text) from `headers` (jsonb):
 * without `content-type: application/json`, the type of nearly every answer
 * (36 B a key); a `content-type` of any other value kept; none at all marked
 * by a null one. And, where `derive` (sql/engine/00025, LOCATION_DERIVED),
 * without a `location` that the key's `path`, a slash and the id that opens
 * the JSON `body` spell exactly: a created resource's (`/api/payments/<id>`,
 * 65 B a key), marked by a `+` before the JSON. answerHeadersRead gives back
 * exactly what was stored.
 */
export const answerHeadersStored = (headers: string, { body, path, derive }: { body: string; path: string; derive: string }) => {
  const kept = (json: string) => `(case when ${json}->>'content-type' = 'application/json' then ${json} - 'content-type'
            when ${json} ? 'content-type' then ${json}
            else ${json} || '{"content-type": null}' end)::text`
  return `(case when ${derive} and ${headers}->>'location' = ${path} || '/' || ${bodyId(body)}
            then '+' || ${kept(`(${headers} - 'location')`)}
            else ${kept(headers)} end)`
}

/** The headers an answer stored by answerHeadersStored was given, as jsonb (`body` and `path` as there). */
export const answerHeadersRead = (stored: string, { body, path }: { body: string; path: string }) => {
  const given = (text: string) => `(case when ${text}::jsonb ? 'content-type' then jsonb_strip_nulls(${text}::jsonb)
            else ${text}::jsonb || '{"content-type": "application/json"}' end)`
  return `(case when left(${stored}, 1) = '+'
            then ${given(`substr(${stored}, 2)`)} || jsonb_build_object('location', ${path} || '/' || ${bodyId(body)})
            else ${given(stored)} end)`
}

/**
 * The id that opens a JSON body (`{"id":"<id>"`, as JSON.stringify writes an
 * object whose first property is its id), or null: read as text, so a body
 * that is not JSON is no error, and an id with an escape is none.
 */
const bodyId = (body: string) => `substring(${body} from '^\\{"id":"([^"\\\\]+)"')`

/**
 * Whether completions store a derivable location apart (answerHeadersStored):
 * set by a contract step (sql/engine/00025) once no process is left that
 * reads answers without deriving it. A scalar subquery of a one-row table.
 * The row is read as JSON, so a database where 00024 has not added the
 * column yet (it waits behind a pending contract step, 00023) reads false.
 */
export const LOCATION_DERIVED = `coalesce((select (to_jsonb(f)->>'location_derived')::boolean from idempotency_key_form f where f.id = 1), false)`

/**
 * A key's state in either of its two forms (sql/engine/00020), as one
 * relation with the old form's columns: what every reader of a key names
 * instead of idempotency_keys, so it reads a key of either form alike.
 *
 * - Old form (its fingerprint as hex): the row says it all; a completion
 *   updated it with its answer.
 * - New form (its fingerprint as bytes, `digest`): the row names the request
 *   and is never updated by a completion. Its request in flight is its
 *   processing entry (the lease's time, deadline, owner, summary, HTTP
 *   request id), its answer a row of idempotency_answers; a release writes
 *   'released' on the row itself, with the entry's time, summary and id.
 *
 * A completed key of the new form keeps no lease time: its `locked_at` reads
 * as its claim's (created_at), which a take-over may have followed.
 *
 * The joins are probes by unique indexes, made only for a new-form row: a
 * reader of one key pays two index lookups more, a reader of the old form
 * none. A new-form key with neither entry nor answer (only a hand-made edit
 * leaves one: every writer changes both in one statement) reads as processing
 * with no deadline, so nothing takes it over by itself.
 *
 * A subquery, not a view: the lane's statements on Citus name each table as
 * its shard (citus-form.ts onShard), which a view would hide. PostgreSQL pulls
 * it up into the statement, so a condition on `k.tenant` and `k.key` is a
 * primary-key probe as on the table.
 */
export const KEY_STATES = `(
    select k.tenant, k.key, k.method, k.path, coalesce(k.fingerprint, encode(k.digest, 'hex')) as fingerprint,
           case when k.digest is null or k.status is not null then k.status
                when a.request_id is not null then 'done'
                else 'processing' end as status,
           k.lease, k.attempts, k.request_id, k.created_at, k.released_at, k.release_reason,
           coalesce(k.locked_at, e.locked_at, k.created_at) as locked_at,
           coalesce(k.stale_at, e.stale_at) as stale_at,
           coalesce(k.owner, e.owner) as owner,
           coalesce(k.summary, e.summary) as summary,
           coalesce(k.http_request_id, e.http_request_id) as http_request_id,
           coalesce(k.completed_at, a.completed_at) as completed_at,
           coalesce(k.response_status, a.response_status) as response_status,
           coalesce(k.response_headers, ${answerHeadersRead('a.response_headers', { body: 'a.response_body', path: 'k.path' })}) as response_headers,
           coalesce(k.response_body, a.response_body) as response_body,
           k.digest is not null as apart
      from idempotency_keys k
      left join idempotency_processing e on k.digest is not null and e.tenant = k.tenant and e.key = k.key and e.lease is not null
      left join idempotency_answers a on k.digest is not null and a.tenant = k.tenant and a.request_id = k.request_id
  )`

/**
 * Whether new claims take the new form: the one row of idempotency_key_form,
 * 'old' until the contract step switches it (a database without the row:
 * old). A scalar subquery of a one-row table, read by each claim statement,
 * so every process switches with its next claim.
 */
export const CLAIMS_APART = `coalesce((select f.form = 'new' from idempotency_key_form f where f.id = 1), false)`
