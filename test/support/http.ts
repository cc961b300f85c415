/** Small helpers for talking to the service like a client does. */

export interface PaymentBody {
  amount: number
  currency: string
  customer: string
  description?: string
}

export const payment = (overrides: Partial<PaymentBody> = {}): PaymentBody => ({
  amount: 1250,
  currency: 'EUR',
  customer: 'cus_1',
  ...overrides,
})

export interface PostOptions {
  apiKey?: string | null
  key?: string | null
  contentType?: string
  headers?: Record<string, string>
  signal?: AbortSignal
}

/** The request a client sends to create a payment (a fresh Idempotency-Key unless `key` says otherwise). */
export function paymentRequest(baseUrl: string, body: unknown, options: PostOptions = {}): Request {
  const headers: Record<string, string> = { 'content-type': options.contentType ?? 'application/json', ...options.headers }
  const apiKey = options.apiKey === undefined ? 'acme-key' : options.apiKey
  if (apiKey !== null) headers.authorization = `Bearer ${apiKey}`
  if (options.key !== null) headers['idempotency-key'] = options.key ?? crypto.randomUUID()
  return new Request(`${baseUrl}/api/payments`, {
    method: 'POST',
    headers,
    body: typeof body === 'string' ? body : JSON.stringify(body),
    ...(options.signal ? { signal: options.signal } : {}),
  })
}

/** POSTs a payment over HTTP to a listening service. */
export async function postPayment(baseUrl: string, body: unknown, options: PostOptions = {}): Promise<Response> {
  return fetch(paymentRequest(baseUrl, body, options))
}

export async function json(response: Response): Promise<any> {
  return JSON.parse(await response.text())
}
