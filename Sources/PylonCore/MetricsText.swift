/// The Prometheus text exposition format (version 0.0.4, what node_exporter's textfile collector
/// reads) of what `bus.status` and each plugin's `<plugin>.status` report. Used by
/// `pylonctl metrics` and by pylond's `metricsTextfile` writer.
///
/// Prometheus conventions (checked by `promtool check metrics` in the tests): base units
/// (`_seconds`, `_bytes`), cumulative counts typed `counter` and named `_total`, singular label
/// names (`plugin`, `stream`, `app_key`, `owner`, `switch`), no configuration values (limits,
/// intervals), and `pylon_build_info`. Each plugin status field that becomes a metric is listed
/// below (docs/CONFIG.md "Metrics" names them all); other fields are not exported.
public struct MetricsText {
    private var families: [String] = []
    private var samples: [String: [String]] = [:]
    private var types: [String: (String, String)] = [:]

    public init() {}

    /// One status field that becomes a metric: its key, the metric's name after the prefix,
    /// its type, help text and the factor to its base unit (ms → s: 0.001).
    struct Field {
        let key: String
        let name: String
        let type: String
        let help: String
        var scale = 1.0
        static func gauge(_ key: String, _ name: String, _ help: String, scale: Double = 1) -> Field {
            Field(key: key, name: name, type: "gauge", help: help, scale: scale)
        }
        static func counter(_ key: String, _ name: String, _ help: String) -> Field {
            Field(key: key, name: name + "_total", type: "counter", help: help)
        }
    }

    /// Renders `bus.status` and the plugins' status replies (by plugin name).
    public static func render(bus: JSON, plugins: [(String, JSON)]) -> String {
        var m = MetricsText()
        m.add("pylon_up", "gauge", "1 when pylond answered bus.status", [], 1)
        m.add(
            "pylon_build_info", "gauge", "pylond's version (the value is always 1)",
            [("version", bus["version"]?.stringValue ?? "unknown")], 1)
        m.add("pylon_uptime_seconds", "gauge", "Seconds since pylond started", [], bus["uptime_s"]?.doubleValue)
        m.add("pylon_resident_memory_bytes", "gauge", "Resident memory of pylond", [], bus["rss_kib"]?.doubleValue.map { $0 * 1024 })
        m.add("pylon_clients", "gauge", "Client connections open", [], bus["clients_total"]?.doubleValue)
        let counters: [Field] = [
            .counter("routed", "pylon_routed", "Messages routed to plugins and providers"),
            .counter("routed_fast", "pylon_routed_fast", "Messages routed on the fast path"),
            .counter("timeouts", "pylon_timeouts", "Requests answered -32002 (timeout)"),
            .counter("protocol_errors", "pylon_protocol_errors", "Malformed or refused messages"),
            .counter("published", "pylon_published", "Notifications published"),
            .counter("held_for_congestion", "pylon_held_for_congestion", "Client messages deferred for a congested plugin"),
            .counter("connections_refused", "pylon_connections_refused", "Connections refused at a connection limit"),
            .counter("slow_readers_closed", "pylon_slow_readers_closed", "Clients disconnected for not reading their replies"),
            .counter("batches", "pylon_batches", "JSON-RPC batches received"),
            .counter("dropped_for_uid_queue", "pylon_dropped_for_uid_queue", "Publications dropped at a uid's queue bound"),
            .counter("monitors_dropped", "pylon_monitors_dropped", "Monitors disconnected for not reading their events"),
            .counter("answered_on_success", "pylon_answered_on_success", "Requests answered by the host for their plugin (_answers)"),
            .gauge("inflight", "pylon_requests_inflight", "Requests awaiting a plugin's reply"),
            .gauge("monitors", "pylon_monitors", "Connections watching traffic (bus.monitor)"),
        ]
        m.addFields("", bus["counters"], counters, [])
        var dropped = 0.0, queued = 0.0
        for c in bus["clients"]?.arrayValue ?? [] {
            dropped += c["dropped_notifications"]?.doubleValue ?? 0
            queued += c["queued_bytes"]?.doubleValue ?? 0
        }
        m.add(
            "pylon_client_dropped_notifications_total", "counter", "Notifications dropped for slow clients (clients visible to the caller)",
            [], dropped)
        m.add("pylon_client_queued_bytes", "gauge", "Bytes queued to clients (clients visible to the caller)", [], queued)
        let pluginFields: [Field] = [
            .counter("restarts", "pylon_plugin_restarts", "Plugin restarts"),
            .counter("requests_served", "pylon_plugin_requests", "Requests the plugin answered"),
            .gauge("inflight", "pylon_plugin_requests_inflight", "Requests in flight to the plugin"),
            .gauge("queued_bytes", "pylon_plugin_queued_bytes", "Bytes queued to the plugin"),
            .gauge("uptime_s", "pylon_plugin_uptime_seconds", "Seconds since the plugin's process started"),
            .gauge("rss_kib", "pylon_plugin_resident_memory_bytes", "Resident memory of the plugin", scale: 1024),
        ]
        for p in bus["plugins"]?.arrayValue ?? [] {
            guard let name = p["name"]?.stringValue else { continue }
            let l = [("plugin", name)]
            m.add("pylon_plugin_up", "gauge", "1 when the plugin is running", l, p["state"]?.stringValue == "running" ? 1 : 0)
            m.add(
                "pylon_plugin_failed", "gauge", "1 when the plugin is failed (its restart intensity was spent)", l,
                p["state"]?.stringValue == "failed" ? 1 : 0)
            if let v = p["version"]?.stringValue {
                m.add("pylon_plugin_info", "gauge", "The plugin's version (the value is always 1)", l + [("version", v)], 1)
            }
            m.addFields("", p, pluginFields, l)
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

    static let uploaderFields: [Field] = [
        .gauge("diskBytes", "disk_bytes", "Bytes the uploader's queue takes on disk"),
        .counter("commits", "commits", "Group commits of the uploader's queue"),
        .gauge("quarantinedFiles", "quarantined_files", "Queue segment files set aside as unreadable"),
    ]
    static let uploaderStreamFields: [Field] = [
        .gauge("queued", "stream_queued_records", "Records queued in the stream"),
        .gauge("queuedBytes", "stream_queued_bytes", "Bytes of the records queued in the stream"),
        .gauge("diskBytes", "stream_disk_bytes", "Bytes the stream takes on disk, dead letters included"),
        .gauge("oldestAgeMs", "stream_oldest_age_seconds", "Age of the stream's oldest queued record", scale: 0.001),
        .gauge("inFlight", "stream_in_flight", "1 while a batch of the stream is being uploaded"),
        .gauge("pendingBatches", "stream_pending_batches", "Batches of the stream waiting to be uploaded"),
        .gauge("retryDelayMs", "stream_retry_delay_seconds", "The stream's last retry delay", scale: 0.001),
        .gauge("retryInMs", "stream_retry_in_seconds", "Time until the stream's next attempt", scale: 0.001),
        .counter("attempts", "stream_attempts", "Upload attempts of the stream"),
        .counter("delivered", "stream_delivered_records", "Records of the stream delivered"),
        .gauge("deadLetters", "stream_dead_letters", "Dead letters held for the stream"),
        .gauge("deadLetterBytes", "stream_dead_letter_bytes", "Bytes of the stream's dead letters"),
        .counter("setAside", "stream_set_aside_records", "Records of the stream set aside as dead letters"),
        .counter("refusedConsent", "stream_refused_consent_records", "Records of the stream refused by a denied consent switch"),
    ]
    static let uploaderOwnerFields: [Field] = [
        .gauge("diskBytes", "owner_disk_bytes", "Bytes the owner's streams take on disk"),
        .gauge("streams", "owner_streams", "Streams the owner has"),
    ]
    static let maFields: [Field] = [
        .gauge("heldEvents", "held_events", "Events held for the uploader"),
        .gauge("waitingEvents", "waiting_events", "Events waiting to be enqueued"),
        .gauge("eventsWaitingForStart", "events_waiting_for_start", "Events waiting for their AppKey's start"),
        .counter("enqueues", "enqueues", "uploader.enqueue calls made"),
        .counter("enqueuedEvents", "enqueued_events", "Events enqueued to the uploader"),
    ]
    static let maAppFields: [Field] = [
        .gauge("started", "app_started", "1 when the AppKey is started"),
        .gauge("collectionEnabled", "app_collection_enabled", "1 when the app enabled data collection"),
        .gauge("pendingStarts", "app_pending_starts", "Starts of the AppKey waiting for the backend"),
        .gauge("queuedChannelValues", "app_queued_channel_values", "Channel values queued for the AppKey"),
        .gauge("background", "app_background", "1 while the app is in the background"),
        .gauge("clients", "app_clients", "Client connections using the AppKey"),
    ]
    static let pushFields: [Field] = [
        .gauge("deviceRegistered", "device_registered", "1 when the device is registered with the backend")
    ]
    static let pushInboxFields: [Field] = [
        .gauge("count", "inbox_messages", "Messages in the push inbox"),
        .gauge("bytes", "inbox_bytes", "Bytes of the messages in the push inbox"),
    ]
    static let gtmFields: [Field] = [
        .gauge("hitsHeld", "hits_held", "Hits held for the uploader"),
        .gauge("queuedPushes", "queued_pushes", "Data-layer pushes queued"),
    ]

    /// A plugin's status. The uploader's, MA's, push's and the tag manager's fields are mapped
    /// by the tables above (per stream `stream`, per AppKey `app_key`, per owner `owner`); every
    /// member of push's `counters` and the tag manager's `totals` is a `_total` counter. Other
    /// plugins: their top-level numbers as gauges and their `counters` object as counters.
    mutating func addPluginStatus(_ plugin: String, _ s: JSON) {
        let prefix = "pylon_" + MetricsText.snake(plugin) + "_"
        func each(_ key: String, label: String, _ fields: [Field]) {
            for (item, v) in s[key]?.objectValue ?? JSONObject() { addFields(prefix, v, fields, [(label, item)]) }
        }
        func counters(_ key: String) {
            for (k, v) in s[key]?.objectValue ?? JSONObject() {
                add(prefix + MetricsText.snake(k) + "_total", "counter", "\(plugin).status \(key).\(k)", [], v.numberValue)
            }
        }
        switch plugin {
        case "uploader":
            addFields(prefix, s, MetricsText.uploaderFields, [])
            each("streams", label: "stream", MetricsText.uploaderStreamFields)
            each("owners", label: "owner", MetricsText.uploaderOwnerFields)
        case "ma":
            addFields(prefix, s, MetricsText.maFields, [])
            each("appKeys", label: "app_key", MetricsText.maAppFields)
        case "push":
            addFields(prefix, s, MetricsText.pushFields, [])
            if let c = s["connection"]?.stringValue {
                add(prefix + "broker_connected", "gauge", "1 while connected to the MQTT broker", [], c == "connected" ? 1 : 0)
            }
            addFields(prefix, s["inbox"], MetricsText.pushInboxFields, [])
            counters("counters")
        case "gtm":
            addFields(prefix, s, MetricsText.gtmFields, [])
            counters("totals")
        default:
            for (k, v) in s.objectValue ?? JSONObject() where k != "code" && !k.hasPrefix("max") {
                if case .object = v { continue }
                add(prefix + MetricsText.snake(k), "gauge", "\(plugin).status \(k)", [], v.numberValue)
            }
            counters("counters")
        }
    }

    mutating func addFields(_ prefix: String, _ o: JSON?, _ fields: [Field], _ labels: [(String, String)]) {
        guard let o else { return }
        for f in fields {
            guard let v = o[f.key]?.numberValue else { continue }
            add(prefix + f.name, f.type, f.help, labels, v * f.scale)
        }
    }

    /// One sample of family `name` (its HELP and TYPE written once, before its first sample);
    /// nil adds nothing. Label values are escaped. Also used by `pylon-backend`'s `/metrics`.
    public mutating func add(_ name: String, _ type: String, _ help: String, _ labels: [(String, String)], _ value: Double?) {
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

    public var text: String {
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
    var numberValue: Double? {
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
