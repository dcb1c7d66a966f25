import PylonHTTP
import PylonPluginKit

/// The MA backend over HTTP: retried POSTs, and the per-AppKey queue of starts and identifies.
extension MAService {
    /// POSTs to the MA backend, retrying network failures and 5xx with backoff until it answers
    /// (an offline start waits for the backend; later calls wait behind it).
    /// `failed`: told of each failed attempt that is retried (its number, the delay before the
    /// next, the reason).
    func backend(
        _ path: String, _ body: JSON, retry: Bool, failed: ((Int, UInt64, String) -> Void)? = nil,
        _ done: @escaping (Result<JSON, MAError>) -> Void
    ) {
        post(path, Array(body.serialized.utf8), retry: retry, attempt: 1, failed: failed, done)
    }

    /// One attempt with the body serialised once for all retries.
    private func post(
        _ path: String, _ body: [UInt8], retry: Bool, attempt: Int, failed: ((Int, UInt64, String) -> Void)?,
        _ done: @escaping (Result<JSON, MAError>) -> Void
    ) {
        let req = HTTPRequest(
            method: "POST", url: config.backend + path,
            headers: [("Content-Type", "application/json")] + DeviceCredential.headers(config.credentialFile, log: plugin.log),
            body: body, timeoutMs: 10_000)
        http.send(req) { [unowned self] r in
            switch r {
            // 401: the device credential is not (yet) one the backend knows — the push plugin
            // registers the device again and `credentialFile` is read again for the next
            // attempt (docs/PUSH.md, "A backend that forgot the device"): retried as a 5xx.
            case .success(let resp) where resp.status < 500 && resp.status != 401:
                guard resp.status == 200, let j = try? JSON.parse(resp.bodyText) else {
                    done(.failure(MAError(message: "backend answered HTTP \(resp.status)")))
                    return
                }
                done(.success(j))
            case .success(let resp):
                self.again(path, body, retry: retry, attempt: attempt, reason: "HTTP \(resp.status)", failed: failed, done)
            case .failure(let e):
                self.again(path, body, retry: retry, attempt: attempt, reason: e.description, failed: failed, done)
            }
        }
    }

    private func again(
        _ path: String, _ body: [UInt8], retry: Bool, attempt: Int, reason: String, failed: ((Int, UInt64, String) -> Void)?,
        _ done: @escaping (Result<JSON, MAError>) -> Void
    ) {
        guard retry else {
            done(.failure(MAError(message: "backend unreachable: \(reason)")))
            return
        }
        let delay = BackoffPolicy(initialMs: config.retryInitialMs, maxMs: config.retryMaxMs).delay(attempt: attempt)
        plugin.log.warn("MA backend unavailable; retrying", ["path": path, "reason": reason, "in_ms": delay])
        failed?(attempt, delay, reason)
        plugin.loop.after(ms: delay) { [unowned self] in
            self.post(path, body, retry: retry, attempt: attempt + 1, failed: failed, done)
        }
    }

    /// Queues a start or identifyAccount for `inst`: when its turn comes, `prepare` runs and
    /// returns the backend path and body; the backend is retried until it answers; `handle`
    /// turns its answer into the reply through `finish`. The next queued op begins only after
    /// that reply (strict call order per AppKey).
    ///
    /// Offline (docs/MA.md, "Offline"): when an attempt fails with a network error or 5xx the
    /// call is answered pending (-32008) at once and the op goes on; a call queued while the
    /// AppKey waits for the network is answered pending when queued. `opSeq`: the op's row in
    /// `identity_ops`, removed once the backend answered; `call` nil: run again after a restart.
    func identityOp(
        _ inst: MAInstance, _ call: Call?, opSeq: Int64?, prepare: @escaping () -> (path: String, body: JSON),
        handle: @escaping (JSON, @escaping (JSON) -> Void) -> Void
    ) {
        if inst.networkWait != nil {
            call?.fail(pendingAnswer(inst))
        } else if let call {
            // Not answered within `pendingAfterMs` (a backend that does not answer, or a long
            // queue): pending, so that no client gives up on a call that still takes effect.
            plugin.loop.after(ms: config.pendingAfterMs) { [unowned self] in call.fail(self.pendingAnswer(inst)) }
        }
        inst.enqueueOp { [unowned self] in
            let (path, body) = prepare()
            func finish(_ reply: JSON) {
                self.forgetOp(opSeq)
                call?.reply(reply)
                inst.opFinished()
                // The queue is empty: parked events go with the EUID now known.
                if inst.pendingStarts == 0 { self.releaseParked(inst) }
            }
            self.backend(
                path, body, retry: true,
                failed: { [unowned self] attempt, delay, reason in
                    self.networkFailed(inst, attempt: attempt, delayMs: delay, reason: reason)
                    call?.fail(self.pendingAnswer(inst))
                }
            ) { r in
                inst.networkWait = nil
                switch r {
                case .failure(let why): finish(MAService.result(MACode.failed, why.message))
                case .success(let j): handle(j, finish)
                }
            }
        }
    }
}
