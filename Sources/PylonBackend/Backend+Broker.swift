import PylonCore
import PylonMQTT

/// The broker's per-device credentials and ACLs, through mosquitto's dynamic-security plugin
/// (`--mqtt-dynsec`; docs/SECURITY.md, "Broker"). The backend connects as the dynsec admin and,
/// when it registers a device, creates:
///
/// - a role `pylon-dev-{deviceId}` that may subscribe to and receive `pylon/push/d/{deviceId}`
///   and the broadcast topic `pylon/push/all`, and publish `pylon/push/ack/{deviceId}`, nothing else (mosquitto 2.0 dynsec has no `%c`/`%u`
///   substitution, hence one role per device);
/// - a client with username `{deviceId}`, the device token as password, and the fixed client id
///   `pylon-push-{installId}`, so no one else can take over the device's persistent session.
///
/// Renewing a device's token sets the client's password (the broker disconnects the old
/// session). Commands not yet confirmed by the broker (`correlationData` = device id) are sent
/// again after every reconnect.
///
/// A nats-server broker cluster (`--mqtt-nats-auth`) needs none of this: registration returns a
/// user JWT limited to the device's topics as its broker password (`NATSAuth.swift`).
extension Backend {
    static let dynsecTopic = "$CONTROL/dynamic-security/v1"
    static let dynsecResponseTopic = "$CONTROL/dynamic-security/v1/response"

    static func deviceRole(_ deviceId: String) -> String { "pylon-dev-" + deviceId }

    /// The dynsec commands that give device `deviceId` its broker identity.
    static func dynsecCommands(deviceId id: String, installId: String, password: String, renewed: Bool) -> JSON {
        let role = deviceRole(id)
        var cmds: [JSON] = [
            [
                "command": "createRole", "rolename": .string(role), "correlationData": .string(id),
                "acls": [
                    ["acltype": "subscribeLiteral", "topic": .string(deviceTopic(id)), "allow": true],
                    ["acltype": "unsubscribeLiteral", "topic": .string(deviceTopic(id)), "allow": true],
                    ["acltype": "publishClientReceive", "topic": .string(deviceTopic(id)), "allow": true],
                    ["acltype": "publishClientSend", "topic": .string(ackTopic(id)), "allow": true],
                    ["acltype": "subscribeLiteral", "topic": .string(broadcastTopic), "allow": true],
                    ["acltype": "unsubscribeLiteral", "topic": .string(broadcastTopic), "allow": true],
                    ["acltype": "publishClientReceive", "topic": .string(broadcastTopic), "allow": true],
                ],
            ],
            [
                "command": "createClient", "username": .string(id), "password": .string(password),
                "clientid": .string(mqttClientId(installId: installId)), "correlationData": .string(id),
                "roles": [["rolename": .string(role)]],
            ],
        ]
        if renewed {
            cmds.append([
                "command": "setClientPassword", "username": .string(id), "password": .string(password), "correlationData": .string(id),
            ])
        }
        return ["commands": .array(cmds)]
    }

    /// Gives a (re)registered device its broker identity; kept until the broker confirms it.
    func brokerAddDevice(deviceId: String, installId: String, password: String, renewed: Bool) {
        guard dynsec, mqtt != nil else { return }
        let payload = Array(
            Backend.dynsecCommands(deviceId: deviceId, installId: installId, password: password, renewed: renewed).serialized.utf8)
        pendingDynsec[deviceId] = payload
        sendDynsec(deviceId, payload)
    }

    private func sendDynsec(_ deviceId: String, _ payload: [UInt8]) {
        guard let mqtt, mqtt.state == .connected else { return }  // sent on the next connect
        mqtt.publish(Backend.dynsecTopic, payload, qos: 1) { [unowned self] ok in
            if !ok { self.log.warn("broker: device credential not sent; retrying on reconnect", ["deviceId": deviceId]) }
        }
    }

    /// On every (re)connect: send what the broker has not confirmed.
    func brokerConnected() {
        for (id, p) in pendingDynsec { sendDynsec(id, p) }
    }

    /// A dynsec reply: `{"responses": [{"command", "error"?, "correlationData"?}]}`. "already
    /// exists" counts as done (a command repeated after a reconnect).
    func dynsecResponse(_ payload: UnsafeRawBufferPointer) {
        guard let j = try? JSONRef.parse(payload, maxDepth: 8).json, let rs = j["responses"]?.arrayValue else {
            log.warn("broker: malformed dynamic-security response")
            return
        }
        var failed: Set<String> = []
        var seen: Set<String> = []
        for r in rs {
            guard let id = r["correlationData"]?.stringValue else { continue }
            seen.insert(id)
            if let e = r["error"]?.stringValue, !e.lowercased().contains("already exists") {
                failed.insert(id)
                log.error(
                    "broker: dynamic-security command failed", ["deviceId": id, "command": r["command"]?.stringValue ?? "?", "error": e])
            }
        }
        for id in seen where !failed.contains(id) { pendingDynsec[id] = nil }
    }
}
