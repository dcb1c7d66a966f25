import PylonMQTT

/// One simulated device: its credentials, its push session and its event ledger. The fleet
/// drives it; this holds state only.
final class SimDevice {
    enum Phase: String { case waiting, registering, appRegistering, pushRegistering, binding, connecting, ready }

    let index: Int
    let installId: String
    let userId: String
    var phase = Phase.waiting
    /// Setup step failed: retried at this time.
    var setupRetryAtMs: Int64?
    var setupAttempts = 0

    // Credentials from POST /v1/devices/register and /v1/push/register.
    var deviceId: String?
    var token: String?
    var pushToken: String?
    /// Wall-clock ms of the push registration (a peer's broadcast sent before it is expected).
    var pushRegisteredWallMs: Int64?
    var bound = false
    var mqttUsername = ""
    var mqttPassword = ""
    var clientId = ""
    var deviceTopic = ""
    var ackTopic = ""
    /// Empty: none.
    var broadcastTopic = ""

    // Push session.
    var mqtt: MQTTClient?
    var brokerIndex: Int
    var connected = false
    var everConnected = false
    var disconnectedSinceMs: Int64?
    /// Message ids already passed to the app (repeats are dropped, as pylon-push does).
    var seen: Set<String> = []
    var seenOrder: [String] = []

    // Events: sequence numbers 0..<generated exist; 0..<batchedUpTo were put in a batch.
    var pacer: RatePacer?
    /// Wall-clock ms of the first event (timestamps are derived from it, so a re-sent batch is
    /// byte for byte the same).
    var eventsStartWallMs: Int64 = 0
    var generated: Int64 = 0
    var batchedUpTo: Int64 = 0
    var inflight: Range<Int64>?
    var inflightSent = false
    var batchAttempts = 0
    var batchRetryAtMs: Int64?
    var acked = RangeSet()
    var rejected: Int64 = 0
    var throttled: Int64 = 0

    init(index: Int, runId: String, devicesPerUser: Int, brokers: Int) {
        self.index = index
        installId = "fleet-\(runId)-\(index)"
        userId = "fleet-\(runId)-u\(index / devicesPerUser)"
        brokerIndex = index % max(1, brokers)
    }

    var pendingEvents: Int64 { generated - acked.count - rejected }

    /// Remembers a delivered message id; false when it was already delivered.
    func markSeen(_ id: String) -> Bool {
        guard seen.insert(id).inserted else { return false }
        seenOrder.append(id)
        if seenOrder.count > FleetOptions.Limits.maxSeenPerDevice {
            let drop = seenOrder.count - FleetOptions.Limits.maxSeenPerDevice
            for x in seenOrder.prefix(drop) { seen.remove(x) }
            seenOrder.removeFirst(drop)
        }
        return true
    }
}
