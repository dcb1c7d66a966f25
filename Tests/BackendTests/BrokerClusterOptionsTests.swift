import PylonCore
import PylonMQTT
import Testing

@testable import PylonBackend

/// Broker-cluster configuration and the NATS credential encoding (issue 23 item 3).
@Suite struct BrokerClusterOptionsTests {
    @Test func mqttTakesAListOfAddresses() throws {
        let o = try Options.parse(["--mqtt", "10.0.0.1:1883,[::1]:1884,localhost:1885"])
        #expect(o.mqtt.map(\.description) == ["10.0.0.1:1883", "[::1]:1884", "127.0.0.1:1885"])
        #expect(o.mqttProtocol == "auto")
        #expect(try Options.parse(["--mqtt", "h:1"]).mqtt.count == 1, "one address still works")
        #expect(throws: Options.UsageError.self) { try Options.parse(["--mqtt", "h:1,nope"]) }
        #expect(throws: Options.UsageError.self) { try Options.parse(["--mqtt", "h:1,"]) }
        let many = (1...17).map { "h:\($0)" }.joined(separator: ",")
        #expect(throws: Options.UsageError.self) { try Options.parse(["--mqtt", many]) }
        #expect(throws: Options.UsageError.self) { try Options.parse(["--mqtt-protocol", "4"]) }
        #expect(throws: Options.UsageError.self) { try Options.parse(["--mqtt-nats-auth", "/x"]) }
        #expect(throws: Options.UsageError.self) {
            try Options.parse(["--mqtt", "h:1", "--mqtt-username", "u", "--mqtt-dynsec", "--mqtt-nats-auth", "/x"])
        }
    }

    @Test func pluginBrokerListAndProtocol() {
        let o = MQTTOptions(
            json: ["brokers": ["a:1", "b:2", 7, "c:99999"], "protocol": "auto", "host": "ignored", "port": 5], clientId: "c")
        #expect(o.addresses.map(\.description) == ["a:1", "b:2"])
        #expect(o.ignored.count == 2, "the bad entries are named")
        #expect(o.protocolVersion == 5 && o.protocolFallback)
        let single = MQTTOptions(json: ["host": "h", "port": 1884, "protocol": "3.1.1"], clientId: "c")
        #expect(single.addresses.map(\.description) == ["h:1884"])
        #expect(single.protocolVersion == 4 && !single.protocolFallback)
        #expect(MQTTOptions(json: ["protocol": "6"], clientId: "c").ignored.count == 1)
    }

    /// The same seed as tools/pylon-nats-auth encodes (bytes 0…31, account key).
    @Test func nkeysMatchThePythonTool() throws {
        let seed = Array(UInt8(0)...31)
        #expect(
            NKey.encodePublic(NKey.account, try #require(NKey.publicKey(seed: seed)))
                == "AAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3QPZV")
        let text = "SAAAAAICAMCAKBQHBAEQUCYMBUHA6EARCIJRIFIWC4MBSGQ3DQOR4HYMHI"
        let d = try #require(NKey.decodeSeed(text))
        #expect(d.prefix == NKey.account && d.seed == seed)
        #expect(NKey.decodeSeed("SAAAAAICAMCAKBQHBAERUCYMBUHA6EARCIJRIFIWC4MBSGQ3DQOR4HYMHI") == nil, "a bad CRC is refused")
        let auth = try #require(NATSAuth(account: "AAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3QPZV", seed: text))
        let jwt = try #require(auth.deviceJWT(deviceId: "d1", now: 1_000_000))
        #expect(jwt.split(separator: ".").count == 3)
        #expect(NATSAuth(account: "not-a-key", seed: text) == nil)
    }
}
