import PylonCore

/// What every answer passes through (`Backend.handle`): the request counters of `/metrics`,
/// the console's security headers on every response that is not a device route's, and the
/// audit entry of a change an operator made through an endpoint that writes none itself.
extension Backend {
    func finish(_ request: HTTPRequest, _ d: Disposition) -> Disposition {
        switch d {
        case .respond(let r, let delay): return .respond(finish(request, r), delayMs: delay)
        case .later(let answer):
            let path = String(request.path)
            answer.observer = { [unowned self] r in console.metrics.count(path: path[...], r, now: System.wallClockMs()) }
            return d
        default: return d
        }
    }

    private func finish(_ request: HTTPRequest, _ response: HTTPResponse) -> HTTPResponse {
        console.metrics.count(path: request.path, response, now: System.wallClockMs())
        if let (e, p) = console.current, !console.audited, response.status < 400, !Backend.isRead(request.method) {
            switch p {
            case .operator, .session:
                if case .console = e { break }
                if case .gtmPublish(let id) = e, let v = response.body["version"]?.stringValue.flatMap({ Int64($0) }) {
                    do throws(StoreError) { try store.recordGTMActor(id, version: v, actor: p.actor) } catch {
                        log.warn("cannot record who published", ["id": id, "error": error.description])
                    }
                }
                audit(p, Backend.auditAction(request, e), target: auditTarget(request, e), detail: response.body)
            default: break
            }
        }
        return consoleAnswer(request, response)
    }

    /// What a change acted on: a push send's target (`<appId> <targetType> <target>`), the
    /// container or AppKey; else the path.
    private func auditTarget(_ request: HTTPRequest, _ e: Endpoint) -> String {
        switch e {
        case .pushSend:
            let b = (try? jsonBody(request)) ?? .null
            return [b["appId"]?.stringValue ?? "-", b["targetType"]?.stringValue ?? "device", b["target"]?.stringValue ?? ""]
                .joined(separator: " ")
        case .gtmPublish(let id): return id
        case .maSetApp(let k), .maSetMetadata(let k): return k
        default: return String(request.path)
        }
    }

    /// `GET|HEAD /…`: a file of `--console-dir` (404 without one; 405 for other methods).
    func staticFile(_ request: HTTPRequest, _ path: String) throws(APIError) -> HTTPResponse {
        guard let files = console.files else { throw .notFound(request.path) }
        guard Backend.isRead(request.method) else { throw .methodNotAllowed(request.method, allowed: ["GET", "HEAD"]) }
        guard let f = files.lookup(path) else { throw .notFound(request.path) }
        return HTTPResponse(headers: [("Cache-Control", "no-cache")], contentType: f.contentType, bytes: f.bytes)
    }

    /// Whether `path` is a device route (ingest, registration, MA, push, container fetches),
    /// whose answers go to devices and carry no browser headers.
    static func isDevicePath(_ path: Substring) -> Bool {
        let r = MetricsCounters.routes[MetricsCounters.route(path)]
        return r == "ingest" || r == "device"
    }

    /// A response as the console's routes send it: with `ConsoleLimits.securityHeaders`
    /// unless it is a device route's.
    func consoleAnswer(_ request: HTTPRequest, _ response: HTTPResponse) -> HTTPResponse {
        guard !Backend.isDevicePath(request.path) else { return response }
        var r = response
        r.headers += ConsoleLimits.securityHeaders
        return r
    }
}
