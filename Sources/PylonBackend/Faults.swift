import PylonCore

/// Injected faults, set through `/v1/faults`. A value type: `next()` consumes one decision.
///
/// Order of precedence for a matching request: `dropNext` (close without answering), then
/// `failNext` (answer `status` with `Retry-After` when set, store nothing). `latencyMs` delays
/// every matching response, failed ones included, until cleared; dropped connections close at
/// once. `holdIngest` stalls the ingest lane (`IngestLane`): batches are read and queued but
/// none is stored or answered until it is cleared, as when the store cannot keep up.
struct FaultState: Equatable {
    var failNext = 0
    var status = 503
    var retryAfter: Int?
    var latencyMs = 0
    var dropNext = 0
    var holdIngest = false

    enum Decision: Equatable {
        case pass
        case fail(status: Int, retryAfter: Int?)
        case drop
    }

    /// Consumes one fault for a matching request.
    mutating func next() -> Decision {
        if dropNext > 0 {
            dropNext -= 1
            return .drop
        }
        if failNext > 0 {
            failNext -= 1
            return .fail(status: status, retryAfter: retryAfter)
        }
        return .pass
    }

    /// Merges the fields present in `body` (a JSON object) into the state. `retryAfter: null`
    /// removes the header. Validates everything before changing anything.
    mutating func merge(_ body: JSON) throws(APIError) {
        guard let o = body.objectValue else { throw .badRequest(.invalidRequest, "fault settings must be a JSON object") }
        var next = self
        for (key, value) in o {
            func int(_ range: ClosedRange<Int>) throws(APIError) -> Int {
                guard let i = value.intValue, range.contains(Int(i)) else {
                    throw .badRequest(.invalidRequest, "\(key) must be an integer in \(range.lowerBound)...\(range.upperBound)")
                }
                return Int(i)
            }
            switch key {
            case "failNext": next.failNext = try int(0...1_000_000)
            case "status": next.status = try int(400...599)
            case "retryAfter": next.retryAfter = value.isNull ? nil : try int(0...86_400)
            case "latencyMs": next.latencyMs = try int(0...Limits.maxLatencyMs)
            case "dropNext": next.dropNext = try int(0...1_000_000)
            case "holdIngest":
                guard let b = value.boolValue else { throw .badRequest(.invalidRequest, "holdIngest must be true or false") }
                next.holdIngest = b
            default: throw .badRequest(.invalidRequest, "unknown fault setting \(key)")
            }
        }
        self = next
    }

    var json: JSON {
        [
            "failNext": .int(Int64(failNext)), "status": .int(Int64(status)),
            "retryAfter": retryAfter.map { .int(Int64($0)) } ?? .null,
            "latencyMs": .int(Int64(latencyMs)), "dropNext": .int(Int64(dropNext)), "holdIngest": .bool(holdIngest),
        ]
    }
}
