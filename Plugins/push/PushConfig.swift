import PylonMQTT
import PylonPluginKit

/// The push plugin's codes (replies carry `code`; 0 is success, as the SDK's nil error).
enum PushCode {
    static let ok: Int64 = 0
    /// NEED_DELIVERYTOKEN: no device token (registration did not complete in time).
    static let needToken: Int64 = 3001
    /// Invalid parameters.
    static let invalidParams: Int64 = 3002
    /// Not permitted: the appId belongs to another uid or client, or the callback is not served
    /// by the calling client.
    static let notPermitted: Int64 = 3003
    /// A configured limit was reached (`data`/message names it).
    static let limit: Int64 = 3004
    /// The push backend failed (network error or 5xx) or refused the call.
    static let backend: Int64 = 3005
    /// `push.liveActivityBind` with filter `call`: the call repeats one that succeeded or is in
    /// flight (`message: "callRepeat"`).
    static let callRepeat: Int64 = 3006
    /// The open report could not be queued (uploader refused, e.g. consent or quota).
    static let reportFailed: Int64 = 3007
    /// NEED_USERID: bind/unbind without a user id.
    static let needUserId: Int64 = 3012
}

/// Configuration (plugin `config` in pylon.json); every limit is named here.
struct PushConfig {
    /// Longest broker credential accepted from the backend's registration reply (a NATS JWT).
    static let maxBrokerPasswordBytes = 8192
    /// Broker refusals of the credential in a row before the device enrols again for a new one.
    static let refusalsBeforeReEnrolment = 3
    /// The topic every device reads broadcasts on (the backend's `Backend.broadcastTopic`).
    static let broadcastTopic = "pylon/push/all"
    /// The broker reconnect backoff's ceiling unless `broker.backoffMaxMs` sets another: while
    /// the broker stays away the waits double from `broker.backoffInitialMs` (250 ms) up to this
    /// (±20 %, never above it), so an unreachable broker costs one attempt every 1.6 to 2 min.
    static let defaultBrokerBackoffMaxMs: UInt64 = 120_000
    var backend = "http://127.0.0.1:8780"
    /// The enrolment credential presented to `POST /v1/devices/register` (the fleet-level device
    /// key the other plugins' `credentialFile` names too); none: the backend's open enrolment.
    var credentialFile: String?
    /// Where the device token the backend issues is kept (mode 0600); default
    /// `<stateDir>/device.token`. Other plugins may name it as their `credentialFile`.
    var deviceTokenFile: String?
    /// Uids (besides admin clients) that may change this device's push identity
    /// (`push.bind`, `push.unbind`, `push.setDeviceToken`) and see it in `push.status`.
    var ownerUids: Set<Int64> = []
    var broker: JSON = .object([:])
    /// Registration waits for `push.register` ("privacy control at startup").
    var deferRegistration = false
    /// How long bind/unbind/liveActivityBind and `push.register` wait for a token.
    var tokenWaitMs: Int64 = 10_000
    var registerRetryInitialMs: Int64 = 1000
    var registerRetryMaxMs: Int64 = 60_000
    /// How often a registered device asks the backend whether it still knows it (the same
    /// `POST /v1/push/register`: its own token back while it does); 0: never.
    var registrationCheckMs: Int64 = 900_000
    /// Least time between two re-registrations after the backend lost the device.
    var minReregisterIntervalMs: Int64 = 60_000
    var httpTimeoutMs = 10_000
    var delivery = Delivery.Limits()
    /// Largest MQTT payload accepted (larger: counted malformed, dropped).
    var maxPayloadBytes = 16 * 1024
    /// Apps that may attach (distinct appIds ever attached).
    var maxApps = 64
    /// Dedup keys remembered (message ids and msgKeys), oldest forgotten first.
    var maxSeen = 100_000
    /// Ops (bind/unbind/liveActivityBind) queued waiting for their turn (3004 beyond).
    var maxQueuedOps = 1024
    /// Acknowledgement reports held for the backend while the broker is unreachable; beyond it
    /// the oldest reports are dropped (the messages stay acknowledged locally).
    var maxPendingAckReports = 10_000

    /// The broker connection's options (`broker`, read by `MQTTOptions`) for `clientId`, with
    /// the push plugin's reconnect ceiling (`defaultBrokerBackoffMaxMs`) unless `broker` sets one.
    func brokerOptions(clientId: String) -> MQTTOptions {
        var o = MQTTOptions(json: broker, clientId: clientId)
        if broker["backoffMaxMs"] == nil { o.backoffMaxMs = max(o.backoffInitialMs, Self.defaultBrokerBackoffMaxMs) }
        return o
    }

    /// Warnings (unknown settings) of the last read.
    private(set) var warnings: [String] = []

    init() {}

    /// Reads `plugins[push].config` strictly (`ConfigReader`): a wrong type or a value out of
    /// bounds is an error naming its path (the plugin exits 78; `pylond --check-config` shows
    /// it), an unknown setting a warning. `broker` is read by `MQTTOptions`; what it cannot use
    /// is an error here too.
    init(_ j: JSON) throws(ConfigProblems) {
        var r = ConfigReader(j)
        if let v = r.httpURL("backend") { backend = v }
        credentialFile = r.string("credentialFile")
        deviceTokenFile = r.string("deviceTokenFile")
        r.accept("ownerUids", "broker")
        if let v = j["ownerUids"], v != .null {
            let uids = v.arrayValue?.compactMap { $0.intValue }.filter { $0 >= 0 }
            if let uids, uids.count == v.arrayValue?.count {
                ownerUids = Set(uids)
            } else {
                r.fail("ownerUids", "must be a list of uids (integers ≥ 0)")
            }
        }
        if let v = j["broker"], v != .null {
            if v.objectValue == nil {
                r.fail("broker", "must be an object")
            } else {
                broker = v
                for why in MQTTOptions(json: v, clientId: "check").ignored { r.fail("broker", why) }
            }
        }
        if let v = r.bool("deferRegistration") { deferRegistration = v }
        if let v = r.int("tokenWaitMs", 1...600_000) { tokenWaitMs = v }
        if let v = r.int("registerRetryInitialMs", 1...600_000) { registerRetryInitialMs = v }
        if let v = r.int("registerRetryMaxMs", 1...3_600_000) { registerRetryMaxMs = v }
        if let v = r.int("registrationCheckMs", 0...86_400_000) { registrationCheckMs = v }
        if let v = r.int("minReregisterIntervalMs", 1...86_400_000) { minReregisterIntervalMs = v }
        if let v = r.int("httpTimeoutMs", 100...600_000) { httpTimeoutMs = Int(v) }
        if let v = r.int("inboxMaxCount", 1...1_000_000) { delivery.maxCount = Int(v) }
        if let v = r.int("inboxMaxBytes", 1024...(1 << 32)) { delivery.maxBytes = Int(v) }
        if let v = r.int("maxInFlightPerApp", 1...65536) { delivery.maxInFlightPerApp = Int(v) }
        if let v = r.int("ackTimeoutMs", 10...3_600_000) { delivery.ackTimeoutMs = v }
        if let v = r.int("retryInitialMs", 1...600_000) { delivery.retryInitialMs = v }
        if let v = r.int("retryMaxMs", 1...3_600_000) { delivery.retryMaxMs = v }
        if let v = r.int("maxPayloadBytes", 256...(1 << 20)) { maxPayloadBytes = Int(v) }
        if let v = r.int("maxApps", 1...100_000) { maxApps = Int(v) }
        if let v = r.int("maxSeen", 100...10_000_000) { maxSeen = Int(v) }
        if let v = r.int("maxQueuedOps", 1...100_000) { maxQueuedOps = Int(v) }
        if let v = r.int("maxPendingAckReports", 1...1_000_000) { maxPendingAckReports = Int(v) }
        try r.check()
        warnings = r.unknown
    }
}

/// `push.status` counters beyond the delivery machine's.
struct PushCounters {
    var received = 0, duplicates = 0, malformed = 0, unknownFields = 0, schemaMismatch = 0
    var backendErrors = 0, opensReported = 0
}

extension String {
    /// 1 to 128 of [A-Za-z0-9._-].
    var isValidPushId: Bool {
        (1...128).contains(utf8.count)
            && utf8.allSatisfy { c in
                (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c)
                    || c == UInt8(ascii: ".") || c == UInt8(ascii: "_") || c == UInt8(ascii: "-")
            }
    }
}
