import Foundation
import PylonClientKit
import TestSupport
import Testing

/// A three-node nats-server cluster and a backend that mints the devices' broker credentials.
final class ClusterWorld: PushSender {
    let cluster: TestBrokerCluster
    let backend: TestBackend

    /// - Parameter backendOrder: the order the backend tries the nodes in.
    init(backendOrder: [Int] = [1, 2, 0]) throws {
        cluster = try TestBrokerCluster()
        backend = try TestBackend(args: cluster.backendArgs(order: backendOrder))
    }

    /// The push plugin against the cluster (device connections tried in `order`), as `PushWorld`.
    func plugins(order: [Int] = [0, 1, 2], _ extra: JSONObject = [:]) -> [JSON] {
        PushWorld.plugins(
            backend,
            broker: [
                "brokers": .array(cluster.mqttAddresses(order).map { .string($0) }), "protocol": "3.1.1", "keepaliveS": 5,
                "backoffInitialMs": 50, "backoffMaxMs": 500,
            ], extra)
    }

    /// `POST /v1/admin/push/send`, retried while the backend's broker connection comes up.
    @discardableResult
    func send(_ body: JSONObject) throws -> JSON { try PushWorld.send(backend, body, timeout: 30) }

    struct Device {
        let id: String
        /// The broker password: the device's user JWT.
        let password: String
        let clientId: String
        /// A push token of the device (admin sends target tokens).
        let pushToken: String
    }

    /// Registers install `installId` with the enrolment secret, then a push token for it.
    func register(_ installId: String) throws -> Device {
        let r = try backend.request("POST", "/v1/devices/register", body: ["installId": .string(installId)])
        guard r.status == 200, let id = r.json["deviceId"]?.stringValue, let pw = r.json["mqtt"]?["password"]?.stringValue,
            let cid = r.json["mqtt"]?["clientId"]?.stringValue, let devToken = r.json["token"]?.stringValue
        else { throw TestFailure(description: "registration failed: \(r.status) \(r.json.serialized)") }
        let p = try backend.request("POST", "/v1/push/register", body: ["installId": .string(installId)], auth: .some(devToken))
        guard let t = p.json["token"]?.stringValue else { throw TestFailure(description: "no push token: \(p.json.serialized)") }
        return Device(id: id, password: pw, clientId: cid, pushToken: t)
    }

    /// Copies the nodes', the backend's and the host's logs to /tmp/pylon-cluster-logs (the
    /// test directories go when the test ends) for a failure to be read.
    func keepLogs(_ h: TestHost) {
        let d = "/tmp/pylon-cluster-logs"
        let fm = FileManager.default
        try? fm.removeItem(atPath: d)
        try? fm.createDirectory(atPath: d, withIntermediateDirectories: true)
        for n in cluster.nodes { try? fm.copyItem(atPath: cluster.dir + "/\(n.name).log", toPath: d + "/\(n.name).log") }
        try? fm.copyItem(atPath: backend.dir + "/backend.log", toPath: d + "/backend.log")
        try? fm.copyItem(atPath: h.logPath, toPath: d + "/pylond.log")
    }

    func deliveries(_ msgId: String) throws -> [JSON] {
        try backend.request("GET", "/v1/inspect/push/deliveries?msgId=\(msgId)").json["deliveries"]?.arrayValue ?? []
    }
}

/// Issue 23 item 3: push through a nats-server MQTT cluster (JetStream-kept sessions), with the
/// devices' JWT credentials and topic permissions.
@Suite(.serialized) struct BrokerClusterTests {
    /// The device attaches via node A; A is killed; sends made meanwhile reach the app exactly
    /// once after the device resumed its persistent session on B or C.
    @Test func aDeviceWhoseNodeDiesGetsWhatWasSentMeanwhileOnceOnAnotherNode() throws {
        let w = try ClusterWorld()
        let h = try TestHost(plugins: w.plugins())
        let token = try h.pushToken(timeout: 30)
        let before = try h.pushStatus()
        #expect(before["broker"]?.stringValue == w.cluster.mqttAddresses([0])[0], "attached via node A")
        #expect(before["brokerProtocol"] == "3.1.1")
        let app = try PushApp(h, appId: "fo")
        let first = try w.send(["appId": "fo", "target": .string(token), "title": "before"])
        let p0 = try #require(try app.receive(timeoutMs: 15_000))
        #expect(p0["message"]?["id"] == first["msgId"])
        try waitUntil(timeout: 10) { try h.pushCounter("acknowledged") == 1 }

        w.cluster.kill9(0)
        var sent: [String] = []
        for i in 0..<3 {
            let r = try w.send(["appId": "fo", "target": .string(token), "title": .string("meanwhile \(i)")])
            sent.append(try #require(r["msgId"]?.stringValue))
        }
        var got: [String] = []
        while got.count < sent.count, let p = try app.receive(timeoutMs: 45_000) {
            got.append(p["message"]?["id"]?.stringValue ?? "?")
        }
        #expect(got.sorted() == sent.sorted(), "every message sent while node A was dead arrives")
        do {
            for id in sent { try waitUntil(timeout: 30) { try w.deliveries(id).first?["ackedAt"]?.intValue != nil } }
        } catch {
            w.keepLogs(h)
            throw error
        }
        try waitUntil(timeout: 10) { try h.pushCounter("acknowledged") == 4 }
        let after = try h.pushStatus()
        #expect(after["connection"] == "connected")
        #expect(after["broker"]?.stringValue != w.cluster.mqttAddresses([0])[0], "moved to node B or C")
        #expect(after["counters"]?["delivered"] == 4)
        #expect(try w.drain(app, host: h, token: token) == [], "each message reached the app once")
        #expect(try h.pushCounter("delivered") == 6, "and then the two markers")
    }

    /// A device that comes from mosquitto (its broker password is its device token) is refused
    /// by the cluster, enrols again and connects with the JWT it gets.
    @Test func aDeviceWithAnOldCredentialEnrolsAgainAndConnects() throws {
        let w = try ClusterWorld()
        let r = try w.backend.request("POST", "/v1/devices/register", body: ["installId": "from-mosquitto"])
        let old = try #require(r.json["token"]?.stringValue)
        let tokenFile = w.cluster.dir + "/device.token"
        try (old + "\n").write(toFile: tokenFile, atomically: true, encoding: .utf8)
        chmod(tokenFile, 0o600)
        let h = try TestHost(plugins: w.plugins(["deviceTokenFile": .string(tokenFile)]))
        _ = try h.pushToken(timeout: 30)
        let log = try String(contentsOfFile: h.logPath, encoding: .utf8)
        #expect(log.contains("enrolling again"), "it was refused first")
        #expect(try String(contentsOfFile: tokenFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines) != old)
    }

    /// No anonymous path, no forged or foreign credential; a device subscribes to and receives
    /// only its own topic, publishes only its own ack topic; the JWT does not open core NATS.
    @Test func devicesReadOnlyTheirOwnTopicAndForgeNothing() throws {
        let w = try ClusterWorld(backendOrder: [0, 1, 2])
        let a = try w.register("inst-a")
        let b = try w.register("inst-b")
        let c = w.cluster
        #expect(try c.probe(node: 1, [])["connack"] == 5, "anonymous: not authorised")
        #expect(try c.probe(node: 1, ["--user", a.id, "--password", "wrong"])["connack"] == 5)
        #expect(try c.probe(node: 1, ["--user", a.id, "--password", b.password.uppercased()])["connack"] == 5)
        // A's JWT with B's name in it: the signature no longer matches.
        let parts = a.password.split(separator: ".").map(String.init)
        let claims = try #require(Data(base64Encoded: base64(parts[1])))
        let forgedClaims = String(decoding: claims, as: UTF8.self).replacingOccurrences(of: a.id, with: b.id)
        let forged = [parts[0], unbase64url(Data(forgedClaims.utf8)), parts[2]].joined(separator: ".")
        #expect(try c.probe(node: 1, ["--user", b.id, "--password", forged])["connack"] == 5, "a forged JWT is refused")

        // B's persistent session exists (subscribed), then goes offline.
        let bSub = try c.probe(
            node: 2,
            [
                "--user", b.id, "--password", b.password, "--client-id", b.clientId, "--sub", "pylon/push/d/" + b.id, "--until-acked",
                "--wait-ms", "3000",
            ])
        #expect(bSub["suback"] == [1])
        // A: its own topic yes; B's topic, wildcards and the delivery subjects no.
        let r = try c.probe(
            node: 1,
            [
                "--user", a.id, "--password", a.password, "--client-id", a.clientId, "--sub", "pylon/push/d/" + a.id,
                "--sub", "pylon/push/d/" + b.id, "--sub", "#", "--sub", "pylon/push/d/+", "--sub", "$MQTT/sub/#", "--sub", "$MQTT/#",
                "--pub", "pylon/push/d/" + b.id, #"{"id":"mforged","appId":"x"}"#, "--until-acked", "--wait-ms", "3000",
            ])
        #expect(r["connack"] == 0)
        #expect(r["suback"] == [1, 128, 128, 128, 128, 128])
        // A send to B, then A "acknowledges" it on B's ack topic: the backend must not record it.
        let sent = try w.send(["appId": "acl", "target": .string(b.pushToken), "title": "for b"])
        let msgId = try #require(sent["msgId"]?.stringValue)
        _ = try c.probe(
            node: 1,
            ["--user", a.id, "--password", a.password, "--pub", "pylon/push/ack/" + b.id, #"{"ids":["\#(msgId)"]}"#, "--wait-ms", "500"])
        // B comes back: it gets the backend's send and not A's forged publish (which, let through,
        // would be in B's session before the send, so delivered first).
        let bBack = try c.probe(
            node: 0, ["--user", b.id, "--password", b.password, "--client-id", b.clientId, "--expect", "1", "--wait-ms", "10000"])
        let topics = bBack["messages"]?.arrayValue ?? []
        #expect(topics.count == 1, "\(bBack.serialized)")
        #expect(topics.first?.arrayValue?.last?.stringValue?.contains(msgId) == true)
        #expect(try w.deliveries(msgId).first?["ackedAt"] == .null, "another device cannot acknowledge B's message")
        // The device JWT is for MQTT only: the core NATS port refuses it.
        #expect(try c.coreConnect(node: 1, jwt: a.password).contains("Authorization Violation"))
    }

    /// A device using another device's client id takes over (kicks) that session's connection,
    /// but its own permissions apply: it receives nothing of the other's, and the owner gets the
    /// messages once it is back.
    @Test func anotherDevicesClientIdGetsNothingOfTheirs() throws {
        let w = try ClusterWorld(backendOrder: [0, 1, 2])
        let a = try w.register("inst-a")
        let b = try w.register("inst-b")
        let c = w.cluster
        let aSub = try c.probe(
            node: 1,
            [
                "--user", a.id, "--password", a.password, "--client-id", a.clientId, "--sub", "pylon/push/d/" + a.id, "--until-acked",
                "--wait-ms", "3000",
            ])
        #expect(aSub["suback"] == [1])
        let token = a.pushToken
        // B holds A's client id (A's session) while the backend sends to A.
        let thief = try c.startProbe(node: 2, ["--user", b.id, "--password", b.password, "--client-id", a.clientId, "--wait-ms", "4000"])
        // Its restore of A's subscription is refused (B may not read A's topic): the takeover happened.
        try waitUntil(timeout: 10) { (try? String(contentsOfFile: c.dir + "/n3.log", encoding: .utf8))?.contains(a.clientId) == true }
        let sent = try w.send(["appId": "cid", "target": .string(token), "title": "for a"])
        let msgId = try #require(sent["msgId"]?.stringValue)
        let stolen = try TestBrokerCluster.finish(thief)
        #expect(stolen["connack"] == 0, "a valid credential may use any client id (and so kick its holder)")
        #expect(stolen["messages"] == [], "but it receives nothing of A's session")
        let aBack = try c.probe(
            node: 0, ["--user", a.id, "--password", a.password, "--client-id", a.clientId, "--expect", "1", "--wait-ms", "10000"])
        #expect(
            aBack["messages"]?.arrayValue?.contains { $0.arrayValue?.last?.stringValue?.contains(msgId) == true } == true,
            "\(aBack.serialized)")
    }

    private func base64(_ s: String) -> String {
        var b = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while b.count % 4 != 0 { b += "=" }
        return b
    }

    private func unbase64url(_ d: Data) -> String {
        d.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
