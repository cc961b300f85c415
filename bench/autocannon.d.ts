/** The part of autocannon's programmatic API the bench uses (the package ships no types). */
declare module 'autocannon' {
  interface RequestParams {
    method?: string
    path?: string
    headers?: Record<string, string>
    body?: string
  }
  interface Options {
    url: string
    connections?: number
    duration?: number
    amount?: number
    pipelining?: number
    timeout?: number
    method?: string
    headers?: Record<string, string>
    body?: string
    requests?: (RequestParams & { setupRequest?: (request: RequestParams) => RequestParams })[]
  }
  interface Histogram {
    average: number
    p50: number
    p99: number
    max: number
  }
  interface Result {
    requests: Histogram & { total: number; sent: number }
    latency: Histogram
    duration: number
    errors: number
    timeouts: number
    non2xx: number
    statusCodeStats: Record<string, { count: number }>
  }
  interface Instance extends PromiseLike<Result> {
    on(event: 'response', listener: (client: unknown, statusCode: number, resBytes: number, responseTime: number) => void): this
    on(event: string, listener: (...args: unknown[]) => void): this
    stop(): void
  }
  function autocannon(options: Options): Instance
  export default autocannon
}
