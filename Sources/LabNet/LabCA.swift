import Crypto
import Foundation
import HeraldCore
import SwiftASN1
import X509
#if canImport(Glibc)
import Glibc
#endif

/// The lab's certificate authority on swift-certificates: keys and certificates as PEM files.
/// Keys are EC P-256 and signatures ECDSA with SHA-256; serials are 16 random bytes; names are
/// O=HeraldLab, CN=the common name; a certificate is valid from an hour ago (a clock a little
/// behind still takes it) for `days`. Keys are PKCS#8 PEM ("PRIVATE KEY"), mode 0600 from
/// creation. Every file is written whole or not at all (`Durable`: temporary file, fsync, rename).
public enum LabCA {
    /// The days a certificate may be valid: at least one, at most a hundred years.
    static let validDays = 1...36_500

    /// A new CA, valid `days`: CA with path length 0 (it signs leaves only), keyCertSign and
    /// cRLSign (both critical), and a subject key identifier that its certificates name.
    public static func create(commonName: String, days: Int, certificate: String, key: String) throws {
        let (notBefore, notAfter) = try validity(days)
        let name = try subject(commonName)
        let secret = P256.Signing.PrivateKey()
        let signer = Certificate.PrivateKey(secret)
        let cert = try made("cannot make the CA certificate") {
            try Certificate(version: .v3, serialNumber: serial(), publicKey: signer.publicKey,
                            notValidBefore: notBefore, notValidAfter: notAfter, issuer: name, subject: name,
                            signatureAlgorithm: .ecdsaWithSHA256,
                            extensions: try Certificate.Extensions {
                                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                                SubjectKeyIdentifier(hash: signer.publicKey)
                            },
                            issuerPrivateKey: signer)
        }
        try write(secret.pemRepresentation, to: key, mode: 0o600)
        try write(try cert.serializeAsPEM().pemString, to: certificate, mode: 0o644)
    }

    /// A certificate for `commonName`, valid for the host names and addresses `names` (brackets
    /// around an IPv6 address are dropped; no names, no subjectAltName), signed by the CA: not a
    /// CA, digitalSignature and keyEncipherment (critical), serverAuth and clientAuth, and the
    /// CA's key identifier. The CA's key must be its certificate's.
    public static func issue(caCertificate: String, caKey: String, commonName: String, names: [String], days: Int,
                             certificate: String, key: String) throws {
        let (notBefore, notAfter) = try validity(days)
        let name = try subject(commonName)
        let alternativeNames = try subjectAlternativeNames(names)
        let (ca, _) = try readCertificate(caCertificate, "the CA certificate")
        let caSigner = try readKey(caKey)
        guard caSigner.publicKey == ca.publicKey else {
            throw NetError(.tls, "the CA key \(caKey) is not the key of the CA certificate \(caCertificate)")
        }
        let caKeyID: ArraySlice<UInt8>
        do {
            // A CA without one (not made here) is named by the hash of its key, as OpenSSL does.
            caKeyID = try ca.extensions.subjectKeyIdentifier?.keyIdentifier ?? SubjectKeyIdentifier(hash: ca.publicKey).keyIdentifier
        } catch {
            throw NetError(.tls, "cannot read the CA certificate \(caCertificate): its subject key identifier is garbled (\(reason(error)))")
        }
        let algorithm = try signatureAlgorithm(caSigner, caKey)
        let secret = P256.Signing.PrivateKey()
        let subjectKey = Certificate.PrivateKey(secret).publicKey
        let cert = try made("cannot issue the certificate") {
            try Certificate(version: .v3, serialNumber: serial(), publicKey: subjectKey,
                            notValidBefore: notBefore, notValidAfter: notAfter, issuer: ca.subject, subject: name,
                            signatureAlgorithm: algorithm,
                            extensions: try Certificate.Extensions {
                                Critical(BasicConstraints.notCertificateAuthority)
                                Critical(KeyUsage(digitalSignature: true, keyEncipherment: true))
                                try ExtendedKeyUsage([.serverAuth, .clientAuth])
                                AuthorityKeyIdentifier(keyIdentifier: caKeyID)
                                if let alternativeNames { alternativeNames }
                            },
                            issuerPrivateKey: caSigner)
        }
        try write(secret.pemRepresentation, to: key, mode: 0o600)
        try write(try cert.serializeAsPEM().pemString, to: certificate, mode: 0o644)
    }

    /// The SHA-256 fingerprint of the first certificate in a PEM file (its DER as in the file):
    /// 64 lower-case hex digits, no separators.
    public static func fingerprint(certificate: String) throws -> String {
        let (_, der) = try readCertificate(certificate, "the certificate")
        return HeraldCore.SHA256.hash(Data(der))
    }

    // MARK: - Parts

    static func validity(_ days: Int) throws -> (notBefore: Date, notAfter: Date) {
        guard validDays.contains(days) else {
            throw NetError(.tls, "a certificate's days must be between \(validDays.lowerBound) and \(validDays.upperBound), not \(days)")
        }
        let now = Date()
        return (now - 3600, now + Double(days) * 86400)
    }

    /// O=HeraldLab, CN=`commonName` (1 to 64 characters, the X.509 bound).
    static func subject(_ commonName: String) throws -> DistinguishedName {
        guard (1...64).contains(commonName.unicodeScalars.count) else {
            throw NetError(.tls, "a certificate's common name must be 1 to 64 characters, not \(commonName.unicodeScalars.count)")
        }
        return try DistinguishedName {
            OrganizationName("HeraldLab")
            CommonName(commonName)
        }
    }

    /// 16 random bytes, the first from 1 to 0x7F: a positive number of 16 bytes, as OpenSSL
    /// wrote them. (A first byte of 0 was dropped as a leading zero, leaving 15 bytes whose first
    /// could have its top bit set: 1 serial in 128, which LabCATests caught as "not positive".)
    static func serial() -> Certificate.SerialNumber {
        var bytes = (0..<16).map { _ in UInt8.random(in: 0...255) }
        bytes[0] = UInt8.random(in: 1...0x7F)
        return Certificate.SerialNumber(bytes: bytes)
    }

    /// IP literals (v4 and v6) as IP names, anything else as a DNS name; nil for no names.
    static func subjectAlternativeNames(_ names: [String]) throws -> SubjectAlternativeNames? {
        if names.isEmpty { return nil }
        return SubjectAlternativeNames(try names.map { given -> GeneralName in
            let name = HostPort.unbracketed(given)
            guard !name.isEmpty, name.allSatisfy({ $0.isASCII && $0 != "," && !$0.isWhitespace }) else {
                throw NetError(.tls, "a certificate's names: \"\(given)\" is not a host name or an IP address")
            }
            var v4 = in_addr(), v6 = in6_addr()
            if inet_pton(AF_INET, name, &v4) == 1 { return .ipAddress(ASN1OctetString(contentBytes: withUnsafeBytes(of: v4) { ArraySlice($0) })) }
            if inet_pton(AF_INET6, name, &v6) == 1 { return .ipAddress(ASN1OctetString(contentBytes: withUnsafeBytes(of: v6) { ArraySlice($0) })) }
            return .dnsName(name)
        })
    }

    /// ECDSA with SHA-256 for an EC key (all the CAs made here), RSA with SHA-256 for an RSA one.
    static func signatureAlgorithm(_ key: Certificate.PrivateKey, _ path: String) throws -> Certificate.SignatureAlgorithm {
        guard let algorithm = [Certificate.SignatureAlgorithm.ecdsaWithSHA256, .sha256WithRSAEncryption]
            .first(where: key.supportedSignatureAlgorithms.contains) else {
            throw NetError(.tls, "cannot read the CA key \(path): it cannot sign with SHA-256 (an EC or RSA key is needed)")
        }
        return algorithm
    }

    static func made(_ failure: String, _ make: () throws -> Certificate) throws -> Certificate {
        do { return try make() } catch let e as NetError { throw e } catch {
            throw NetError(.tls, "\(failure): \(reason(error))")
        }
    }

    // MARK: - Files

    /// The first certificate in a PEM file, and its DER as the file holds it.
    static func readCertificate(_ path: String, _ what: String) throws -> (Certificate, [UInt8]) {
        guard let pem = try readPEM(path, what).first(where: { ["CERTIFICATE", "X509 CERTIFICATE"].contains($0.discriminator) }) else {
            throw NetError(.tls, "cannot read \(what) \(path): there is no PEM certificate in it")
        }
        do { return (try Certificate(derEncoded: pem.derBytes), pem.derBytes) } catch {
            throw NetError(.tls, "cannot read \(what) \(path): its certificate is garbled (\(reason(error)))")
        }
    }

    /// The CA's private key: the first PEM private key in the file (PKCS#8, SEC1 or RSA).
    static func readKey(_ path: String) throws -> Certificate.PrivateKey {
        guard let pem = try readPEM(path, "the CA key").first(where: { $0.discriminator.hasSuffix("PRIVATE KEY") }) else {
            throw NetError(.tls, "cannot read the CA key \(path): there is no PEM private key in it")
        }
        do { return try Certificate.PrivateKey(pemDocument: pem) } catch {
            throw NetError(.tls, "cannot read the CA key \(path): its \(pem.discriminator) is garbled or of a kind not supported (\(reason(error)))")
        }
    }

    /// The PEM blocks of a regular file of at most 1 MiB (text around them is ignored).
    static func readPEM(_ path: String, _ what: String) throws -> [PEMDocument] {
        func failure(_ problem: String) -> NetError { NetError(.tls, "cannot read \(what) \(path): \(problem)") }
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw failure(NetError.text(errno: errno)) }
        let file = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { throw failure("it is not a regular file") }
        guard st.st_size <= 1 << 20 else { throw failure("it is \(st.st_size) bytes, more than a PEM file here ever holds (1 MiB)") }
        let bytes: Data
        do { bytes = try file.readToEnd() ?? Data() } catch { throw failure("\(error.localizedDescription)") }
        do { return try PEMDocument.parseMultiple(pemString: String(decoding: bytes, as: UTF8.self)) } catch {
            throw failure("its PEM is garbled (\(reason(error)))")
        }
    }

    /// Replaces `path` with `text` (and a final newline) durably; the file has `mode` from the
    /// first byte, and no half-written file is ever left under its name.
    static func write(_ text: String, to path: String, mode: mode_t) throws {
        do { try Durable.write(Data((text + "\n").utf8), to: URL(fileURLWithPath: path), mode: mode) } catch {
            throw NetError(.tls, "cannot write \(path): \(error)")
        }
    }

    /// A library error's short reason (its code, without the library's source location).
    static func reason(_ error: Error) -> String {
        switch error {
        case let e as ASN1Error: return "\(e.code)"
        case let e as CertificateError: return "\(e.code)"
        default: return "\(error)"
        }
    }
}
