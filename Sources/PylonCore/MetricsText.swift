/// The Prometheus text exposition format (version 0.0.4, what node_exporter's textfile collector
/// reads) of what `bus.status` and each plugin's `<plugin>.status` report. Used by
/// `pylonctl metrics` and by pylond's `metricsTextfile` writer.
public struct MetricsText {
    private var families: [String] = []
    private var samples: [String: [String]] = [:]
    private var types: [String: (String, String)] = [:]

    public init() {}

    /// Renders `bus.status` and the plugins' status replies (by plugin name).
    public static func render(bus: JSON, plugins: [(String, JSON)]) -> String {
        var m = MetricsText()
        m.add("pylon_up", "gauge", "1 when pylond answered bus.status", [], 1)
        m.add("pylon_uptime_seconds", "gauge", "Seconds since pylond started", [], bus["uptime_s"]?.doubleValue)
        m.add("pylon_rss_bytes", "gauge", "Resident memory of pylond", [], bus["rss_kib"]?.doubleValue.map { $0 * 1024 })
        m.add("pylon_clients", "gauge", "Client connections open", [], bus["clients_total"]?.doubleValue)
        let counterHelp: [(String, String)] = [
            ("routed", "Messages routed to plugins"), ("routed_fast", "Messages routed on the fast path"),
            ("timeouts", "Requests answered -32002 (timeout)"), ("protocol_errors", "Malformed or refused messages"),
            ("published", "Notifications published"), ("held_for_congestion", "Client messages deferred for a congested plugin"),
            ("connections_refused", "Connections refused at a connection limit"),
        ]
        for (k, help) in counterHelp {
            m.add("pylon_\(k)_total", "counter", help, [], bus["counters"]?[k]?.doubleValue)
        }
        m.add("pylon_inflight", "gauge", "Requests awaiting a plugin's reply", [], bus["counters"]?["inflight"]?.doubleValue)
        var dropped = 0.0, queued = 0.0
        for c in bus["clients"]?.arrayValue ?? [] {
            dropped += c["dropped_notifications"]?.doubleValue ?? 0
            queued += c["queued_bytes"]?.doubleValue ?? 0
        }
        m.add(
            "pylon_client_dropped_notifications_total", "counter", "Notifications dropped for slow clients (clients visible to the caller)",
            [], dropped)
        m.add("pylon_client_queued_bytes", "gauge", "Bytes queued to clients (clients visible to the caller)", [], queued)
        for p in bus["plugins"]?.arrayValue ?? [] {
            guard let name = p["name"]?.stringValue else { continue }
            let l = [("plugin", name)]
            m.add("pylon_plugin_up", "gauge", "1 when the plugin is running", l, p["state"]?.stringValue == "running" ? 1 : 0)
            m.add("pylon_plugin_restarts_total", "counter", "Plugin restarts", l, p["restarts"]?.doubleValue)
            m.add("pylon_plugin_requests_total", "counter", "Requests the plugin answered", l, p["requests_served"]?.doubleValue)
            m.add("pylon_plugin_inflight", "gauge", "Requests in flight to the plugin", l, p["inflight"]?.doubleValue)
            m.add("pylon_plugin_queued_bytes", "gauge", "Bytes queued to the plugin", l, p["queued_bytes"]?.doubleValue)
            m.add("pylon_plugin_rss_bytes", "gauge", "Resident memory of the plugin", l, p["rss_kib"]?.doubleValue.map { $0 * 1024 })
        }
        let consent = bus["consent"]
        m.add(
            "pylon_consent_master_granted", "gauge", "1 while the device master switch is granted", [],
            consent?["master"]?.boolValue == false ? 0 : 1)
        for (k, v) in consent?["refused"]?.objectValue ?? JSONObject() {
            m.add(
                "pylon_consent_refused_total", "counter", "Messages refused or dropped by a denied consent switch", [("switch", k)],
                v.doubleValue)
        }
        for (name, s) in plugins { m.addPluginStatus(name, s) }
        return m.text
    }

    /// A plugin's status: numbers at the top level become `pylon_<plugin>_<key>`, numbers one
    /// object deeper (`streams.demo.queued`) `pylon_<plugin>_<container>_<key>{<container>="demo"}`;
    /// cumulative counts (delivered, setAside, refusedConsent, attempts, commits) are counters.
    /// (`deadLetters` is how many are held now: it falls when they are re-queued or discarded.)
    mutating func addPluginStatus(_ plugin: String, _ s: JSON) {
        let counters: Set<String> = ["delivered", "setAside", "refusedConsent", "attempts", "commits"]
        func metric(_ parts: [String], _ key: String) -> (String, String) {
            let base = "pylon_" + (parts + [MetricsText.snake(key)]).joined(separator: "_")
            return counters.contains(key) ? (base + "_total", "counter") : (base, "gauge")
        }
        for (k, v) in s.objectValue ?? JSONObject() {
            if let d = v.numberValue {
                let (n, t) = metric([MetricsText.snake(plugin)], k)
                add(n, t, "\(plugin).status \(k)", [], d)
            } else if let container = v.objectValue {
                for (item, sub) in container {
                    guard let so = sub.objectValue else { continue }
                    let label = MetricsText.snake(k)
                    for (sk, sv) in so {
                        guard let d = sv.numberValue else { continue }
                        let (n, t) = metric([MetricsText.snake(plugin), label], sk)
                        add(n, t, "\(plugin).status \(k).*.\(sk)", [(label, item)], d)
                    }
                }
            }
        }
    }

    mutating func add(_ name: String, _ type: String, _ help: String, _ labels: [(String, String)], _ value: Double?) {
        guard let value else { return }
        if types[name] == nil {
            types[name] = (type, help)
            families.append(name)
        }
        var line = name
        if !labels.isEmpty {
            line += "{" + labels.map { "\($0.0)=\"\(MetricsText.escape($0.1))\"" }.joined(separator: ",") + "}"
        }
        let v = value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
        samples[name, default: []].append(line + " " + v)
    }

    var text: String {
        var out = ""
        for f in families {
            let (t, h) = types[f]!
            out += "# HELP \(f) \(h)\n# TYPE \(f) \(t)\n"
            for s in samples[f]! { out += s + "\n" }
        }
        return out
    }

    /// `deadLetters` → `dead_letters`; anything outside [a-zA-Z0-9_] → `_`.
    static func snake(_ s: String) -> String {
        var out = ""
        for ch in s.unicodeScalars {
            if ch.properties.isUppercase, !out.isEmpty { out += "_" }
            let c = Character(ch)
            if c.isLetter || c.isNumber, ch.isASCII { out += String(c).lowercased() } else { out += "_" }
        }
        return out
    }

    static func escape(_ s: String) -> String {
        s.replacingAll("\\", "\\\\").replacingAll("\"", "\\\"").replacingAll("\n", "\\n")
    }
}

extension JSON {
    fileprivate var numberValue: Double? {
        switch self {
        case .int, .double: return doubleValue
        case .bool(let b): return b ? 1 : 0
        default: return nil
        }
    }
}

extension String {
    fileprivate func replacingAll(_ a: Character, _ b: String) -> String {
        var out = ""
        for c in self { if c == a { out += b } else { out.append(c) } }
        return out
    }
}
