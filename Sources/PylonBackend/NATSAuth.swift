import CCrypto
import PylonCore

/// The device credentials of a nats-server broker cluster with decentralized JWT auth
/// (`--mqtt-nats-auth`; docs/SECURITY.md, "Broker cluster"; docs/FLEET.md).
///
/// nats-server 2.9 has no auth callout, so the backend cannot answer the broker at connect
/// time; instead it mints, at registration, a *bearer* user JWT for the device (MQTT cannot
/// sign the server's nonce, so the JWT itself is the credential; the device sends it as its MQTT
/// password). The JWT is signed with a signing key of the Pylon account (the account JWT,
/// preloaded into every node's MEMORY resolver by `tools/pylon-nats-auth init`, lists that key),
/// so no broker configuration changes per device. Its claims:
///
/// - `name` = the device id;
/// - publish allowed on `pylon.push.ack.{deviceId}` only (MQTT `pylon/push/ack/{deviceId}`);
/// - subscribe allowed on `pylon.push.d.{deviceId}`, the broadcast subject `pylon.push.all`, and
///   `$MQTT.sub.>` (the delivery subjects of
///   its own QoS 1 subscriptions; nats-server refuses MQTT subscriptions to `$MQTT.sub.` itself);
/// - `allowed_connection_types: ["MQTT"]`: the JWT does not open the core NATS port, where
///   `$MQTT.sub.>` would reach other devices' deliveries.
///
/// The permissions are in each user JWT rather than in a scoped signing key's `{{name()}}`
/// template: nats-server 2.9 checks `allowed_connection_types` on the user JWT before it applies
/// a scope's template, and a scoped user JWT must carry no limits of its own, so a templated
/// device credential would also open the core NATS port.
package struct NATSAuth: Sendable {
    /// The account's public nkey (`A…`): the JWT's `issuer_account`.
    package let account: String
    private let signingSeed: [UInt8]
    /// The signing key's public nkey (`A…`): the JWT's `iss`.
    package let signingKey: String

    package struct Failure: Error, CustomStringConvertible {
        package let description: String
    }

    /// Reads `{"account": "A…", "signingKey": "SA…"}` from a secret file (0600).
    package static func load(_ path: String) -> Result<NATSAuth, Failure> {
        switch SecretFile.read(path) {
        case .failure(let e): return .failure(Failure(description: e.description))
        case .success(let bytes):
            guard let j = try? JSON.parse(String(decoding: bytes, as: UTF8.self)), let acc = j["account"]?.stringValue,
                let seed = j["signingKey"]?.stringValue
            else {
                return .failure(Failure(description: "\(path): expected {\"account\": \"A…\", \"signingKey\": \"SA…\"}"))
            }
            return NATSAuth(account: acc, seed: seed).map { .success($0) }
                ?? .failure(Failure(description: "\(path): the account or signing key is not a valid account nkey"))
        }
    }

    package init?(account: String, seed: String) {
        guard let a = NKey.decodePublic(account), a.prefix == NKey.account,
            let s = NKey.decodeSeed(seed), s.prefix == NKey.account, let pub = NKey.publicKey(seed: s.seed)
        else { return nil }
        self.account = account
        signingSeed = s.seed
        signingKey = NKey.encodePublic(NKey.account, pub)
    }

    /// The subjects a device may use (NATS form of its MQTT topics).
    static func permissions(deviceId: String) -> (pub: [String], sub: [String]) {
        (["pylon.push.ack." + deviceId], ["pylon.push.d." + deviceId, "pylon.push.all", "$MQTT.sub.>"])
    }

    /// A new bearer user JWT for device `deviceId` (a hex id: one subject token), or nil if
    /// libcrypto failed.
    package func deviceJWT(deviceId: String, now: Int64) -> String? {
        guard let userSeed = NKey.random(32), let userPub = NKey.publicKey(seed: userSeed) else { return nil }
        let (pub, sub) = NATSAuth.permissions(deviceId: deviceId)
        let nats: JSONObject = [
            "pub": ["allow": .array(pub.map { .string($0) })], "sub": ["allow": .array(sub.map { .string($0) })],
            "subs": -1, "data": -1, "payload": -1, "bearer_token": true, "allowed_connection_types": ["MQTT"],
            "issuer_account": .string(account), "type": "user", "version": 2,
        ]
        var claims: JSONObject = [
            "iat": .int(now / 1000), "iss": .string(signingKey), "name": .string(deviceId),
            "sub": .string(NKey.encodePublic(NKey.user, userPub)), "nats": .object(nats),
        ]
        claims["jti"] = .string(NKey.base32(NKey.sha256(Array(JSON.object(claims).serialized.utf8))))
        let head = NKey.base64url(Array(#"{"typ":"JWT","alg":"ed25519-nkey"}"#.utf8))
        let body = NKey.base64url(Array(JSON.object(claims).serialized.utf8))
        let signed = head + "." + body
        guard let sig = NKey.sign(seed: signingSeed, Array(signed.utf8)) else { return nil }
        return signed + "." + NKey.base64url(sig)
    }
}

/// NATS nkeys: ed25519 keys as a prefix byte + key + CRC-16/XMODEM (little-endian), in
/// unpadded RFC 4648 base32; seeds carry the seed prefix and the key type in two bytes.
enum NKey {
    static let seedPrefix: UInt8 = 18 << 3
    static let account: UInt8 = 0
    static let user: UInt8 = 20 << 3
    static let operatorKey: UInt8 = 14 << 3

    static func crc16(_ d: [UInt8]) -> UInt16 {
        var crc: UInt16 = 0
        for b in d {
            crc ^= UInt16(b) << 8
            for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        }
        return crc
    }

    static func withCRC(_ raw: [UInt8]) -> [UInt8] {
        let c = crc16(raw)
        return raw + [UInt8(c & 0xFF), UInt8(c >> 8)]
    }

    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)

    static func base32(_ d: [UInt8]) -> String {
        var out: [UInt8] = []
        var acc: UInt32 = 0, bits = 0
        for b in d {
            acc = (acc << 8) | UInt32(b)
            bits += 8
            while bits >= 5 {
                out.append(alphabet[Int((acc >> UInt32(bits - 5)) & 31)])
                bits -= 5
            }
        }
        if bits > 0 { out.append(alphabet[Int((acc << UInt32(5 - bits)) & 31)]) }
        return String(decoding: out, as: UTF8.self)
    }

    static func unbase32(_ s: String) -> [UInt8]? {
        var out: [UInt8] = []
        var acc: UInt32 = 0, bits = 0
        for c in s.utf8 {
            guard let v = alphabet.firstIndex(of: c) else { return nil }
            acc = (acc << 5) | UInt32(v)
            bits += 5
            if bits >= 8 {
                out.append(UInt8((acc >> UInt32(bits - 8)) & 0xFF))
                bits -= 8
            }
        }
        return out
    }

    static func encodePublic(_ prefix: UInt8, _ key: [UInt8]) -> String { base32(withCRC([prefix] + key)) }

    private static func checked(_ s: String) -> [UInt8]? {
        guard s.utf8.count <= 128, let raw = unbase32(s), raw.count > 2 else { return nil }
        let body = Array(raw.dropLast(2))
        guard crc16(body) == UInt16(raw[raw.count - 2]) | UInt16(raw[raw.count - 1]) << 8 else { return nil }
        return body
    }

    static func decodePublic(_ s: String) -> (prefix: UInt8, key: [UInt8])? {
        guard let b = checked(s), b.count == 33 else { return nil }
        return (b[0], Array(b[1...]))
    }

    static func decodeSeed(_ s: String) -> (prefix: UInt8, seed: [UInt8])? {
        guard let b = checked(s), b.count == 34, b[0] & 0xF8 == seedPrefix else { return nil }
        return (((b[0] & 7) << 5) | (b[1] >> 3), Array(b[2...]))
    }

    static func publicKey(seed: [UInt8]) -> [UInt8]? {
        guard seed.count == 32 else { return nil }
        var pub = [UInt8](repeating: 0, count: 32)
        return pylon_ed25519_public(seed, &pub) == 1 ? pub : nil
    }

    static func sign(seed: [UInt8], _ msg: [UInt8]) -> [UInt8]? {
        var sig = [UInt8](repeating: 0, count: 64)
        return pylon_ed25519_sign(seed, msg, msg.count, &sig) == 1 ? sig : nil
    }

    static func random(_ n: Int) -> [UInt8]? {
        var b = [UInt8](repeating: 0, count: n)
        return pylon_random(&b, Int32(n)) == 1 ? b : nil
    }

    static func sha256(_ d: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        pylon_sha256(d, d.count, &out)
        return out
    }

    static func base64url(_ d: [UInt8]) -> String {
        let a = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        var out: [UInt8] = []
        var i = 0
        while i < d.count {
            let n = min(3, d.count - i)
            let v = (UInt32(d[i]) << 16) | (n > 1 ? UInt32(d[i + 1]) << 8 : 0) | (n > 2 ? UInt32(d[i + 2]) : 0)
            for k in 0...n { out.append(a[Int((v >> UInt32(18 - 6 * k)) & 63)]) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}
