import PylonCore

/// Request counters kept in memory for the life of the process (or until `/v1/admin/reset`).
/// Data counters (records, batches, duplicates) live in the `Store` instead.
struct Stats {
    var requests = 0
    var requestsByPath: [String: Int] = [:]
    var faultsInjected = 0
    /// Requests answered 401 or 403 (logged at debug level only, so a flood costs no log volume).
    var refused = 0

    /// Counts one request; after `Limits.maxDistinctPaths` distinct paths the rest count under
    /// "(other)" so the table stays bounded.
    mutating func count(path: Substring) {
        requests += 1
        let key = String(path)
        if requestsByPath[key] != nil || requestsByPath.count < Limits.maxDistinctPaths {
            requestsByPath[key, default: 0] += 1
        } else {
            requestsByPath["(other)", default: 0] += 1
        }
    }

    var requestsByPathJSON: JSON {
        var o = JSONObject()
        for k in requestsByPath.keys.sorted() { o[k] = .int(Int64(requestsByPath[k]!)) }
        return .object(o)
    }
}
