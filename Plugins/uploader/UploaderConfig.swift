import PylonPluginKit

/// Named limits of the uploader (each configurable in the plugin's config section).
struct UploaderLimits {
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
    func diskBytes(for owner: StreamOwner) -> Int {
        ownerOverrides.isEmpty ? maxDiskBytesPerOwner : ownerOverrides[owner]?.diskBytes ?? maxDiskBytesPerOwner
    }
    func streams(for owner: StreamOwner) -> Int {
        ownerOverrides.isEmpty ? maxStreamsPerOwner : ownerOverrides[owner]?.streams ?? maxStreamsPerOwner
    }
}

/// An invalid `plugins[uploader].config`: the plugin logs it and exits 78 (EX_CONFIG), so the
/// host marks it failed instead of restarting it in a loop.
struct UploaderConfigError: Error, Equatable, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// Where batches may go: operator configuration only (callers cannot set an endpoint), `http` or
/// `https` with a host, optionally restricted to `allowedHosts`. `{stream}` (the stream name) may
/// appear only after the host, so the host of every URL is the template's.
enum EndpointRule {
    static let schemes = ["http", "https"]

    /// The host of an endpoint template, or why it is not acceptable.
    static func check(_ url: String, allowedHosts: Set<String>?) -> Result<String, UploaderConfigError> {
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
        var host = Substring(authority)
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return .failure(UploaderConfigError("endpoint \(url): bad IPv6 host")) }
            host = host[host.index(after: host.startIndex)..<close]
        } else if let colon = host.lastIndex(of: ":") {
            host = host[..<colon]
        }
        guard !host.isEmpty else { return .failure(UploaderConfigError("endpoint \(url) has no host")) }
        let h = host.lowercased()
        if let allowedHosts, !allowedHosts.contains(h) {
            return .failure(UploaderConfigError("endpoint \(url): host \(h) is not in allowedHosts"))
        }
        return .success(h)
    }
}

/// The uploader's configuration, read once at start from `plugins[uploader].config`.
struct UploaderConfig {
    var defaultEndpoint = "http://127.0.0.1:8780/v1/batches/{stream}"
    var limits = UploaderLimits()
    var retry = RetryPolicy()
    var fsyncFull = false
    /// Hosts endpoints may name (lower-case); nil: any.
    var allowedHosts: Set<String>?
    var catalog = StreamCatalog()
    /// The device credential file sent as `Authorization: Bearer` (docs/SECURITY.md, "Backend").
    var credentialFile: String?

    init() {}

    init(_ c: JSON) throws(UploaderConfigError) {
        func int(_ k: String, min lo: Int64 = 0) throws(UploaderConfigError) -> Int? {
            guard let v = c[k], v != .null else { return nil }
            guard let n = v.intValue, n >= lo else { throw UploaderConfigError("\(k) must be an integer ≥ \(lo)") }
            return Int(n)
        }
        if let e = c["endpoint"] {
            guard let s = e.stringValue else { throw UploaderConfigError("endpoint must be a string") }
            defaultEndpoint = s
        }
        if let v = c["credentialFile"], v != .null {
            guard let s = v.stringValue, !s.isEmpty else { throw UploaderConfigError("credentialFile must be a path") }
            credentialFile = s
        }
        if let v = try int("maxDiskBytes", min: 1) { limits.maxDiskBytes = v }
        if let v = try int("maxDiskBytesPerOwner", min: 1) { limits.maxDiskBytesPerOwnerSetting = v }
        if let v = try int("maxStreamsPerOwner", min: 1) { limits.maxStreamsPerOwner = v }
        if let v = try int("requestTimeoutMs", min: 1) { limits.requestTimeoutMs = v }
        if let v = try int("retryInitialMs") { retry.initialMs = UInt64(v) }
        if let v = try int("retryMaxMs") { retry.maxMs = UInt64(v) }
        if let v = try int("maxRetryAfterMs") { retry.maxRetryAfterMs = UInt64(v) }
        fsyncFull = c["fsync"]?.stringValue == "full"
        if let h = c["allowedHosts"], h != .null {
            guard let list = h.arrayValue, list.allSatisfy({ $0.stringValue != nil }) else {
                throw UploaderConfigError("allowedHosts must be an array of host names")
            }
            allowedHosts = Set(list.compactMap { $0.stringValue?.lowercased() })
        }
        if let o = c["owners"], o != .null {
            guard let obj = o.objectValue else { throw UploaderConfigError("owners must be an object of \"plugin:NAME\"/\"uid:N\" keys") }
            for (k, v) in obj {
                guard let owner = StreamOwner(k) else { throw UploaderConfigError("owners: \(k) is not \"plugin:NAME\" or \"uid:N\"") }
                let d = v["maxDiskBytes"]?.intValue.map { Int(max(0, $0)) }
                let s = v["maxStreams"]?.intValue.map { Int(max(0, $0)) }
                limits.ownerOverrides[owner] = (d, s)
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
                var e = StreamCatalog.Entry(pattern: pattern)
                e.endpoint = v["endpoint"]?.stringValue
                e.maxCount = v["maxCount"]?.intValue.map { min(max(1, Int($0)), StreamSettings.maxCountLimit) }
                e.intervalMs = v["intervalMs"]?.intValue.map { UInt64(max(0, $0)) }
                e.maxBatchBytes = v["maxBatchBytes"]?.intValue.map { max(1024, Int($0)) }
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
