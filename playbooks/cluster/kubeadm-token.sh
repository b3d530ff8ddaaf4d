# A bootstrap token minted by gpuk8s (so that it is known, and masked, before use), valid 1 h, and the
# join command with the CA certificate hash.
gk_secret_file {{ config }} {{ size }}
kubeadm token create --config {{ config }} --print-join-command
