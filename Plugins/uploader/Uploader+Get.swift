import PylonHTTP
import PylonPluginKit

/// GET streams (`"delivery": "get"`, such as GTM's `_img` pixels in `gtm.pixels`): each record is
/// one HTTP GET of its `data.url`, delivered through the same queue as every other record, so
/// data still leaves the machine through one door: durably (the record is on disk before the
/// enqueue is answered), under the stream's consent switch, only to the hosts the operator
/// allowed for the stream, one request in flight per stream, retried with backoff on a network
/// error, a 5xx, 408, 429, 401 or 403, set aside on any other 4xx, deleted on a 2xx or a 3xx
/// (the redirect is not followed). A batch of a GET stream is one record (`batchLimit`).
extension Uploader {
    /// The first record of `records` whose `data.url` is not an `http`/`https` URL with a host in
    /// `hosts` (the rules of `EndpointRule`: no credentials, no spaces or control characters), as
    /// the enqueue's -32602.
    static func getURLError(_ records: [PendingRecord], hosts: Set<String>) -> RPCError? {
        for (i, r) in records.enumerated() {
            let data = UnsafeRawBufferPointer(start: r.body, count: Int(r.bodyLength))
            let url = (try? JSONRef.parse(data, maxDepth: Plugin.maxDepth))?.json["url"]?.stringValue
            guard let url else {
                return RPCError(.invalidParams, "records[\(i)].data.url is required on a GET stream: the URL to request")
            }
            if case .failure(let why) = EndpointRule.check(url, allowedHosts: hosts) {
                return RPCError(
                    .invalidParams, "records[\(i)].data.url is not allowed: \(why.description) (the stream's allowedHosts)",
                    data: ["param": "url"])
            }
        }
        return nil
    }

    /// Requests batch `key`'s record's URL (checked again against the hosts in effect now), then
    /// reports the outcome as a batch's (`finished`). A final batch (its switch was denied) is
    /// purged without the request: a GET would hand the hit to the URL's host after the denial.
    func sendGet(stream: String, key: String, hosts: Set<String>) {
        let body: (body: [UInt8], count: Int, recordBytes: Int)
        let final: Bool
        do {
            body = try store.batchBody(key, stream: stream)
            final = try store.isFinal(key)
        } catch {
            batchLoadFailed(stream, key, error)
            return
        }
        guard body.count > 0 else {
            dropEmptyBatch(stream, key)
            return
        }
        let sent = StreamState.SentBatch(key: key, count: body.count, bytes: body.recordBytes, final: final)
        if final {
            finished(stream: stream, endpoint: "", batch: sent, outcome: .retry(reason: "consent denied; not requested", retryAfterMs: nil))
            return
        }
        let record = (try? body.body.withUnsafeBytes { try JSONRef.parse($0, maxDepth: Plugin.maxDepth + 2) })?.json["records"]?.arrayValue?
            .first
        let url = record?["data"]?["url"]?.stringValue ?? ""
        let host: String
        switch EndpointRule.check(url, allowedHosts: hosts) {
        case .success(let h): host = h
        case .failure(let why):
            // Allowed at the enqueue, not any more (the operator changed allowedHosts).
            finished(stream: stream, endpoint: "", batch: sent, outcome: .rejected(status: 0, reason: why.description))
            return
        }
        let req = HTTPRequest(method: "GET", url: url, timeoutMs: limits.requestTimeoutMs)
        http.send(req) { [unowned self] r in
            let outcome: UploadOutcome
            switch r {
            case .success(let resp): outcome = UploadOutcome.classifyGet(status: resp.status, retryAfterMs: resp.retryAfterMs, error: nil)
            case .failure(let e): outcome = UploadOutcome.classifyGet(status: nil, retryAfterMs: nil, error: e.description)
            }
            // A Retry-After holds this host, not the stream's (unused) endpoint.
            self.finished(stream: stream, endpoint: "get:" + host, batch: sent, outcome: outcome)
        }
    }
}
