import PylonHTTP
import PylonPluginKit

/// The MA backend over HTTP: retried POSTs, and the per-AppKey queue of starts and identifies.
extension MAService {
    /// POSTs to the MA backend, retrying network failures and 5xx with backoff until it answers
    /// (an offline start waits for the backend; later calls wait behind it).
    func backend(_ path: String, _ body: JSON, retry: Bool, _ done: @escaping (Result<JSON, MAError>) -> Void) {
        post(path, Array(body.serialized.utf8), retry: retry, attempt: 1, done)
    }

    /// One attempt with the body serialised once for all retries.
    private func post(_ path: String, _ body: [UInt8], retry: Bool, attempt: Int, _ done: @escaping (Result<JSON, MAError>) -> Void) {
        let req = HTTPRequest(
            method: "POST", url: backendURL + path,
            headers: [("Content-Type", "application/json")] + DeviceCredential.headers(credentialFile, log: plugin.log),
            body: body, timeoutMs: 10_000)
        http.send(req) { [unowned self] r in
            switch r {
            case .success(let resp) where resp.status < 500:
                guard resp.status == 200, let j = try? JSON.parse(resp.bodyText) else {
                    done(.failure(MAError(message: "backend answered HTTP \(resp.status)")))
                    return
                }
                done(.success(j))
            case .success(let resp):
                self.again(path, body, retry: retry, attempt: attempt, reason: "HTTP \(resp.status)", done)
            case .failure(let e):
                self.again(path, body, retry: retry, attempt: attempt, reason: e.description, done)
            }
        }
    }

    private func again(
        _ path: String, _ body: [UInt8], retry: Bool, attempt: Int, reason: String,
        _ done: @escaping (Result<JSON, MAError>) -> Void
    ) {
        guard retry else {
            done(.failure(MAError(message: "backend unreachable: \(reason)")))
            return
        }
        let delay = BackoffPolicy(initialMs: retryInitialMs, maxMs: retryMaxMs).delay(attempt: attempt)
        plugin.log.warn("MA backend unavailable; retrying", ["path": path, "reason": reason, "in_ms": delay])
        plugin.loop.after(ms: delay) { [unowned self] in
            self.post(path, body, retry: retry, attempt: attempt + 1, done)
        }
    }

    /// Queues a start or identifyAccount for `inst`: when its turn comes, `prepare` runs and
    /// returns the backend path and body; the backend is retried until it answers; `handle`
    /// turns its answer into the reply through `finish`. The next queued op begins only after
    /// that reply (strict call order per AppKey).
    func identityOp(
        _ inst: MAInstance, _ call: Call, prepare: @escaping () -> (path: String, body: JSON),
        handle: @escaping (JSON, @escaping (JSON) -> Void) -> Void
    ) {
        inst.enqueueOp { [unowned self] in
            let (path, body) = prepare()
            func finish(_ reply: JSON) {
                call.reply(reply)
                inst.opFinished()
            }
            self.backend(path, body, retry: true) { r in
                switch r {
                case .failure(let why): finish(MAService.result(MACode.failed, why.message))
                case .success(let j): handle(j, finish)
                }
            }
        }
    }
}
