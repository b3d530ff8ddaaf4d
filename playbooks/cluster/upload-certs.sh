# The control-plane certificates, encrypted with a certificate key minted by gpuk8s, for joining control planes.
gk_secret_file {{ config }} {{ size }}
gk_kubeadm_lock
gk_to_the_end upload-certs kubeadm init phase upload-certs --upload-certs --config {{ config }}
