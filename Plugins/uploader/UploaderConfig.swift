import PylonPluginKit

/// Named limits of the uploader (each configurable in the plugin's config section).
package struct UploaderLimits {
    /// Disk cap for queued records (bytes of record bodies), shared by every owner. When full,
    /// enqueue is refused with -32004 and nothing already acknowledged is touched.
    var maxDiskBytes = 64 << 20
    /// Each owner's share of the disk cap (config `maxDiskBytesPerOwner`; default a quarter of
    /// `maxDiskBytes`), so one owner (an app's uid, or a plugin) cannot fill the queue for the
    /// others: over it, that owner's enqueues are refused with -32004 and the others keep working.
    var maxDiskBytesPerOwnerSetting: Int?
    var maxDiskBytesPerOwner: Int { maxDiskBytesPerOwnerSetting ?? maxDiskBytes / 4 }
    /// Streams one owner may have (config `maxStreamsPerOwner`): each costs state in memory and a
    /// row in the queue database, so junk stream names are bounded too.
    var maxStreamsPerOwner = 256
    /// Per-owner overrides (config `owners: {"plugin:ma": {"maxDiskBytes": N, "maxStreams": N}}`).
    var ownerOverrides: [StreamOwner: (diskBytes: Int?, streams: Int?)] = [:]
    /// Records per enqueue call and bytes per record.
    var maxRecordsPerCall = 1000
    var maxRecordBytes = 256 * 1024
    /// Upload request timeout.
    var requestTimeoutMs = 30_000

    // (No lookup, so no hashing of the owner, when there are no overrides: every enqueue asks.)
    package func diskBytes(for owner: StreamOwner) -> Int {
        ownerOverrides.isEmpty ? maxDiskBytesPerOwner : ownerOverrides[owner]?.diskBytes ?? maxDiskBytesPerOwner
    }
    func streams(for owner: StreamOwner) -> Int {
        ownerOverrides.isEmpty ? maxStreamsPerOwner : ownerOverrides[owner]?.streams ?? maxStreamsPerOwner
    }
}

/// The bounds of the uploader's numeric configuration (`plugins[uploader].config`). A value
/// outside them, or not an integer, is a configuration error (the plugin exits 78 naming the
/// key and its bounds); nothing is clamped. The per-stream settings' bounds are
/// `StreamSettings.maxCountRange`, `intervalMsRange` and `maxBatchBytesRange`.
enum ConfigBounds {
    /// `maxDiskBytes`, and an `owners` entry's `maxDiskBytes`: up to 1 TiB.
    static let maxDiskBytes: ClosedRange<Int64> = 1...(1 << 40)
    /// `maxDiskBytesPerOwner`: up to `maxDiskBytes` (checked against the value in effect).
    static let maxDiskBytesPerOwner: ClosedRange<Int64> = 1...(1 << 40)
    /// `maxStreamsPerOwner`, and an `owners` entry's `maxStreams` (0 there: no stream at all).
    static let maxStreamsPerOwner: ClosedRange<Int64> = 1...65_536
    static let ownerMaxStreams: ClosedRange<Int64> = 0...65_536
    static let ownerMaxDiskBytes: ClosedRange<Int64> = 0...(1 << 40)
    /// `requestTimeoutMs`: up to 10 minutes.
    static let requestTimeoutMs: ClosedRange<Int64> = 1...600_000
    /// `retryInitialMs` (up to an hour), `retryMaxMs` and `maxRetryAfterMs` (up to a day).
    static let retryInitialMs: ClosedRange<Int64> = 0...3_600_000
    static let retryMaxMs: ClosedRange<Int64> = 0...86_400_000
    static let maxRetryAfterMs: ClosedRange<Int64> = 0...86_400_000

    /// `v` as an integer within `range`, nil when absent or `null`; otherwise the error naming
    /// `key` and the bounds. Whole-valued numbers such as `5.0` count as integers.
    static func int(_ v: JSON?, _ key: String, _ range: ClosedRange<Int64>) throws(UploaderConfigError) -> Int64? {
        guard let v, v != .null else { return nil }
        guard let n = v.intValue, range.contains(n) else {
            throw UploaderConfigError("\(key) must be an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return n
    }
}

/// An invalid `plugins[uploader].config`: the plugin logs it and exits 78 (EX_CONFIG), so the
/// host marks it failed instead of restarting it in a loop.
package struct UploaderConfigError: Error, Equatable, CustomStringConvertible {
    package let description: String
    init(_ d: String) { description = d }
}

/// Where batches may go: operator configuration only (callers cannot set an endpoint), `http` or
/// `https` with a host, optionally restricted to `allowedHosts`. `{stream}` (the stream name) may
/// appear only after the host, so the host of every URL is the template's.
///
/// An `allowedHosts` entry names a host and which ports: `"host"` the scheme's default port only
/// (80 for http, 443 for https), `"host:8080"` that port only, `"host:*"` any port. IPv6 hosts
/// are written in brackets when a port follows (`"[::1]:8080"`); a bare `"::1"` or `"[::1]"` is
/// the default port. Secure by default: `["127.0.0.1"]` does not open every local service.
package enum EndpointRule {
    static let schemes = ["http", "https"]

    /// The host of an endpoint template, or why it is not acceptable.
    package static func check(_ url: String, allowedHosts: Set<String>?) -> Result<String, UploaderConfigError> {
        parse(url, allowedHosts: allowedHosts).map(\.host)
    }

    /// Where a URL goes: its lower-case host and its port (explicit, or the scheme's default),
    /// and `destination`, the two as one `host:port` key (IPv6 in brackets).
    package struct Target: Equatable {
        package var host: String
        package var port: Int
        package var destination: String { (host.contains(":") ? "[\(host)]" : host) + ":\(port)" }
    }

    /// The URL's target, or why it is not acceptable (scheme, characters, credentials, host,
    /// port, `allowedHosts`).
    package static func parse(_ url: String, allowedHosts: Set<String>?) -> Result<Target, UploaderConfigError> {
        guard let sep = url.range(of: "://") else {
            return .failure(UploaderConfigError("endpoint \(url) has no scheme (http:// or https://)"))
        }
        let scheme = url[..<sep.lowerBound].lowercased()
        guard schemes.contains(scheme) else {
            return .failure(UploaderConfigError("endpoint \(url): scheme \(scheme) is not allowed (only http and https)"))
        }
        guard url.utf8.allSatisfy({ $0 > 0x20 && $0 != 0x7F }) else {
            return .failure(UploaderConfigError("endpoint \(url) contains spaces or control characters"))
        }
        let afterScheme = url[sep.upperBound...]
        let authority = afterScheme.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !authority.contains("@") else {
            return .failure(UploaderConfigError("endpoint \(url): credentials in the URL are not supported"))
        }
        guard !authority.contains("{") else {
            return .failure(UploaderConfigError("endpoint \(url): {stream} may only appear in the path"))
        }
        let defaultPort = scheme == "https" ? 443 : 80
        var host = Substring(authority)
        var portText: Substring = ""
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return .failure(UploaderConfigError("endpoint \(url): bad IPv6 host")) }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !rest.isEmpty {
                guard rest.hasPrefix(":") else { return .failure(UploaderConfigError("endpoint \(url): bad IPv6 host")) }
                portText = rest.dropFirst()
            }
        } else if let colon = host.lastIndex(of: ":") {
            portText = host[host.index(after: colon)...]
            host = host[..<colon]
        }
        guard !host.isEmpty else { return .failure(UploaderConfigError("endpoint \(url) has no host")) }
        var port = defaultPort
        if !portText.isEmpty {
            guard portText.count <= 5, portText.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let p = Int(portText),
                (1...65_535).contains(p)
            else { return .failure(UploaderConfigError("endpoint \(url): bad port \(portText)")) }
            port = p
        }
        let target = Target(host: host.lowercased(), port: port)
        if let allowedHosts, !allows(allowedHosts, target, defaultPort: defaultPort) {
            let what = port == defaultPort ? target.host : target.destination
            return .failure(UploaderConfigError("endpoint \(url): \(what) is not in allowedHosts"))
        }
        return .success(target)
    }

    /// Whether `entries` (normalized by `allowedHost`) allow `target`: its host on the default
    /// port, or `host:port`, or `host:*`.
    static func allows(_ entries: Set<String>, _ target: Target, defaultPort: Int) -> Bool {
        let h = target.host.contains(":") ? "[\(target.host)]" : target.host
        if entries.contains(h + ":*") || entries.contains(h + ":\(target.port)") { return true }
        return target.port == defaultPort && entries.contains(target.host)
    }

    /// An `allowedHosts` entry in the form `allows` compares (lower-case; `[v6]` alone as `v6`),
    /// or nil when it is not a host, `host:port` or `host:*`.
    static func allowedHost(_ entry: String) -> String? {
        let e = entry.lowercased()
        guard !e.isEmpty, e.utf8.allSatisfy({ $0 > 0x20 && $0 != 0x7F && $0 != UInt8(ascii: "/") && $0 != UInt8(ascii: "@") })
        else { return nil }
        func portOK(_ p: Substring) -> Bool {
            p == "*" || (p.count <= 5 && p.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } && Int(p).map { (1...65_535).contains($0) } == true)
        }
        if e.hasPrefix("[") {
            guard let close = e.firstIndex(of: "]"), close > e.index(after: e.startIndex) else { return nil }
            let rest = e[e.index(after: close)...]
            if rest.isEmpty { return String(e[e.index(after: e.startIndex)..<close]) }
            guard rest.hasPrefix(":"), portOK(rest.dropFirst()) else { return nil }
            return e
        }
        let colons = e.filter { $0 == ":" }.count
        if colons == 1, let c = e.firstIndex(of: ":") {
            guard c > e.startIndex, portOK(e[e.index(after: c)...]) else { return nil }
        }
        return e  // a host, host:port, or a bare IPv6 address (several colons)
    }

    /// The `allowedHosts` list at `key`, normalized, or the error naming the bad entry.
    static func allowedHosts(_ v: JSON, _ key: String) throws(UploaderConfigError) -> Set<String> {
        guard let list = v.arrayValue, list.allSatisfy({ $0.stringValue != nil }) else {
            throw UploaderConfigError("\(key) must be an array of host names")
        }
        var out = Set<String>()
        for item in list {
            let s = item.stringValue ?? ""
            guard let h = allowedHost(s) else {
                throw UploaderConfigError("\(key): \(s) is not a host, host:port or host:* (IPv6 as [addr]:port)")
            }
            out.insert(h)
        }
        return out
    }
}

/// How the queue's segments store record texts: `deflate`, packed frames (a running deflate
/// stream per lane); `none`, records frames holding the texts as they are sent.
package enum QueueCompression: String, Sendable {
    case deflate, none
}

/// The uploader's configuration, read once at start from `plugins[uploader].config`.
package struct UploaderConfig {
    package var defaultEndpoint = "http://127.0.0.1:8780/v1/batches/{stream}"
    package var limits = UploaderLimits()
    var retry = RetryPolicy()
    var fsyncFull = false
    /// How the queue stores record texts (`queueCompression`, docs/UPLOADER.md "On disk").
    var queueCompression = QueueCompression.deflate
    /// Hosts endpoints may name (lower-case); nil: any.
    package var allowedHosts: Set<String>?
    package var catalog = StreamCatalog()
    /// The device credential file sent as `Authorization: Bearer` (docs/SECURITY.md, "Backend").
    var credentialFile: String?
    /// The pixel sender's bounds (config `pixels`: GET streams, docs/UPLOADER.md).
    var pixels = PixelScheduler.Limits()

    package init() {}

    /// The top-level settings `init` reads (the others are unknown: `unknown`).
    static let settings = [
        "endpoint", "credentialFile", "maxDiskBytes", "maxDiskBytesPerOwner", "maxStreamsPerOwner", "requestTimeoutMs",
        "retryInitialMs", "retryMaxMs", "maxRetryAfterMs", "fsync", "queueCompression", "allowedHosts", "owners", "pixels",
        "pluginNamespaces", "streams",
    ]

    /// Top-level settings of `c` no one reads, as the kit's `ConfigReader` names them
    /// (`config.fo: unknown setting`): a warning at start, an error under `--check-config`.
    package static func unknown(_ c: JSON) -> [String] {
        var r = ConfigReader(c)
        for k in settings { r.accept(k) }
        return r.unknown
    }

    package init(_ c: JSON) throws(UploaderConfigError) {
        func int(_ k: String, _ range: ClosedRange<Int64>) throws(UploaderConfigError) -> Int? {
            try ConfigBounds.int(c[k], k, range).map { Int($0) }
        }
        if let e = c["endpoint"] {
            guard let s = e.stringValue else { throw UploaderConfigError("endpoint must be a string") }
            defaultEndpoint = s
        }
        if let v = c["credentialFile"], v != .null {
            guard let s = v.stringValue, !s.isEmpty else { throw UploaderConfigError("credentialFile must be a path") }
            credentialFile = s
        }
        if let v = try int("maxDiskBytes", ConfigBounds.maxDiskBytes) { limits.maxDiskBytes = v }
        if let v = try int("maxDiskBytesPerOwner", ConfigBounds.maxDiskBytesPerOwner) {
            guard v <= limits.maxDiskBytes else {
                throw UploaderConfigError("maxDiskBytesPerOwner (\(v)) must not exceed maxDiskBytes (\(limits.maxDiskBytes))")
            }
            limits.maxDiskBytesPerOwnerSetting = v
        }
        if let v = try int("maxStreamsPerOwner", ConfigBounds.maxStreamsPerOwner) { limits.maxStreamsPerOwner = v }
        if let v = try int("requestTimeoutMs", ConfigBounds.requestTimeoutMs) { limits.requestTimeoutMs = v }
        if let v = try int("retryInitialMs", ConfigBounds.retryInitialMs) { retry.initialMs = UInt64(v) }
        if let v = try int("retryMaxMs", ConfigBounds.retryMaxMs) { retry.maxMs = UInt64(v) }
        if let v = try int("maxRetryAfterMs", ConfigBounds.maxRetryAfterMs) { retry.maxRetryAfterMs = UInt64(v) }
        guard retry.maxMs >= retry.initialMs else {
            throw UploaderConfigError("retryMaxMs (\(retry.maxMs)) must be at least retryInitialMs (\(retry.initialMs))")
        }
        switch c["fsync"] {
        case nil, .null?, .string("normal")?: fsyncFull = false
        case .string("full")?: fsyncFull = true
        default: throw UploaderConfigError("fsync must be \"normal\" or \"full\"")
        }
        if let v = c["queueCompression"], v != .null {
            guard let t = v.stringValue, let q = QueueCompression(rawValue: t) else {
                throw UploaderConfigError("queueCompression must be \"deflate\" or \"none\"")
            }
            queueCompression = q
        }
        if let h = c["allowedHosts"], h != .null { allowedHosts = try EndpointRule.allowedHosts(h, "allowedHosts") }
        if let o = c["owners"], o != .null {
            guard let obj = o.objectValue else { throw UploaderConfigError("owners must be an object of \"plugin:NAME\"/\"uid:N\" keys") }
            for (k, v) in obj {
                guard let owner = StreamOwner(k) else { throw UploaderConfigError("owners: \(k) is not \"plugin:NAME\" or \"uid:N\"") }
                guard v.objectValue != nil else { throw UploaderConfigError("owners[\(k)] must be an object {maxDiskBytes?, maxStreams?}") }
                let d = try ConfigBounds.int(v["maxDiskBytes"], "owners[\(k)].maxDiskBytes", ConfigBounds.ownerMaxDiskBytes)
                let s = try ConfigBounds.int(v["maxStreams"], "owners[\(k)].maxStreams", ConfigBounds.ownerMaxStreams)
                limits.ownerOverrides[owner] = (d.map { Int($0) }, s.map { Int($0) })
            }
        }
        if let px = c["pixels"], px != .null {
            guard px.objectValue != nil else {
                throw UploaderConfigError("pixels must be an object {maxInFlight?, maxInFlightPerHost?, maxAttempts?, maxScheduled?}")
            }
            let r = PixelScheduler.Limits.self
            if let v = try ConfigBounds.int(px["maxInFlight"], "pixels.maxInFlight", r.maxInFlightRange) { pixels.maxInFlight = Int(v) }
            if let v = try ConfigBounds.int(px["maxInFlightPerHost"], "pixels.maxInFlightPerHost", r.maxInFlightRange) {
                pixels.maxInFlightPerHost = Int(v)
            }
            if let v = try ConfigBounds.int(px["maxAttempts"], "pixels.maxAttempts", r.maxAttemptsRange) { pixels.maxAttempts = Int(v) }
            if let v = try ConfigBounds.int(px["maxScheduled"], "pixels.maxScheduled", r.maxScheduledRange) { pixels.maxScheduled = Int(v) }
            guard pixels.maxInFlightPerHost <= pixels.maxInFlight else {
                throw UploaderConfigError(
                    "pixels.maxInFlightPerHost (\(pixels.maxInFlightPerHost)) must not exceed pixels.maxInFlight (\(pixels.maxInFlight))")
            }
        }
        var namespaces: Set<String>?
        if let n = c["pluginNamespaces"], n != .null {
            guard let list = n.arrayValue, list.allSatisfy({ $0.stringValue != nil }) else {
                throw UploaderConfigError("pluginNamespaces must be an array of strings")
            }
            namespaces = Set(list.compactMap { $0.stringValue })
        }
        var entries: [StreamCatalog.Entry] = []
        if let s = c["streams"], s != .null {
            guard let obj = s.objectValue else { throw UploaderConfigError("streams must be an object of pattern → settings") }
            for (pattern, v) in obj {
                guard v.objectValue != nil else { throw UploaderConfigError("streams[\(pattern)] must be an object of settings") }
                var e = StreamCatalog.Entry(pattern: pattern)
                if let ev = v["endpoint"], ev != .null {
                    guard let url = ev.stringValue else { throw UploaderConfigError("streams[\(pattern)].endpoint must be a string") }
                    e.endpoint = url
                }
                let key = "streams[\(pattern)]."
                e.maxCount = try ConfigBounds.int(v["maxCount"], key + "maxCount", StreamSettings.maxCountRange).map { Int($0) }
                e.intervalMs = try ConfigBounds.int(v["intervalMs"], key + "intervalMs", StreamSettings.intervalMsRange).map {
                    UInt64($0)
                }
                e.maxBatchBytes = try ConfigBounds.int(v["maxBatchBytes"], key + "maxBatchBytes", StreamSettings.maxBatchBytesRange).map {
                    Int($0)
                }
                switch v["delivery"] {
                case nil, .null?, .string("post")?:
                    if v["allowedHosts"] != nil {
                        throw UploaderConfigError("streams[\(pattern)].allowedHosts is for \"delivery\": \"get\" streams")
                    }
                case .string("get")?:
                    var hosts = allowedHosts
                    if let h = v["allowedHosts"], h != .null {
                        hosts = try EndpointRule.allowedHosts(h, "streams[\(pattern)].allowedHosts")
                    }
                    guard let hosts, !hosts.isEmpty else {
                        throw UploaderConfigError(
                            "streams[\(pattern)]: \"delivery\": \"get\" needs allowedHosts (the stream's or the plugin's): the hosts its URLs may name"
                        )
                    }
                    e.getHosts = hosts
                default:
                    throw UploaderConfigError("streams[\(pattern)].delivery must be \"post\" or \"get\"")
                }
                if let cv = v["consent"] {
                    guard let k = cv.stringValue, !k.isEmpty else {
                        throw UploaderConfigError("streams[\(pattern)].consent must be a switch name")
                    }
                    e.consent = k
                }
                if let ov = v["owner"] {
                    guard let t = ov.stringValue, let owner = StreamOwner(t) else {
                        throw UploaderConfigError("streams[\(pattern)].owner must be \"plugin:NAME\" or \"uid:N\"")
                    }
                    e.owner = owner
                }
                entries.append(e)
            }
        }
        catalog = StreamCatalog(entries: entries, pluginNamespaces: namespaces)
        // Every endpoint is checked now, not at the first upload.
        for url in [defaultEndpoint] + entries.compactMap(\.endpoint) {
            if case .failure(let e) = EndpointRule.check(url, allowedHosts: allowedHosts) { throw e }
        }
    }
}
